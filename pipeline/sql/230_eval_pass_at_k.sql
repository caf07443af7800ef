-- pass_at_k(n, c, k): the unbiased estimator of pass@k (Chen et al. 2021, "Evaluating
-- Large Language Models Trained on Code"): the chance that at least one of k trials
-- drawn without replacement from n, of which c succeeded, succeeds:
-- 1 - C(n - c, k) / C(n, k), computed as their numerically stable product
-- 1 - prod_{i = n - c + 1}^{n} (1 - k / i). NULL when k < 1, k > n or c outside [0, n].
-- Grain: scalar.
CREATE OR REPLACE MACRO pass_at_k(n, c, k) AS (
    CASE
        WHEN k < 1 OR k > n OR c < 0 OR c > n THEN NULL
        WHEN c = 0 THEN 0.0
        WHEN n - c < k THEN 1.0
        ELSE 1.0 - list_product([1.0 - k / i for i in range(n - c + 1, n + 1)])
    END
)::DOUBLE
