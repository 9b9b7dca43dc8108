-- Per-account features over the last hour and the last day, as of the refresh: payment
-- counts and amounts, and the share of declined payments. A model is refreshed when its
-- inputs change, so on an idle source these windows are as of the last change.
SELECT account_id,
       sum(CASE WHEN created_at >= now() - INTERVAL '1 hour' THEN 1 ELSE 0 END) AS payments_1h,
       sum(CASE WHEN created_at >= now() - INTERVAL '1 hour' THEN amount ELSE 0 END) AS amount_1h,
       count(*) AS payments_1d,
       sum(amount) AS amount_1d,
       CAST(sum(CASE WHEN status = 'declined' THEN 1 ELSE 0 END) AS DOUBLE) / count(*) AS declined_share_1d
FROM public.transactions
WHERE created_at >= now() - INTERVAL '1 day'
GROUP BY account_id
