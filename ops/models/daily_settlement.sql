-- Settled payments per merchant, currency and day (UTC): what each merchant is paid.
-- Keyed: a change recomputes only its merchant, currency and day (docs/gold.md).
-- key: merchant_id, currency, day
-- key of public.transactions: merchant_id, currency, CAST(created_at AS DATE)
SELECT merchant_id,
       currency,
       CAST(created_at AS DATE) AS day,
       sum(amount) AS settled_amount,
       count(*) AS payments
FROM public.transactions
WHERE status = 'settled'
GROUP BY merchant_id, currency, CAST(created_at AS DATE)
