-- Per account and currency: settled and pending amounts, declined payments.
-- key: account_id, currency
-- key of public.transactions: account_id, currency
SELECT account_id,
       currency,
       sum(CASE WHEN status = 'settled' THEN amount ELSE 0 END) AS settled_amount,
       sum(CASE WHEN status = 'pending' THEN amount ELSE 0 END) AS pending_amount,
       sum(CASE WHEN status = 'declined' THEN 1 ELSE 0 END) AS declined,
       count(*) AS payments
FROM public.transactions
GROUP BY account_id, currency
