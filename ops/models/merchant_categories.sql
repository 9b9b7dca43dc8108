-- Settled amounts per merchant category and currency: a model over a model and a table.
SELECT m.category,
       s.currency,
       sum(s.settled_amount) AS settled_amount,
       sum(s.payments) AS payments
FROM daily_settlement s
JOIN public.merchants m ON m.id = s.merchant_id
GROUP BY m.category, s.currency
