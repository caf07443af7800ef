-- pass_hat_k(n, c, k): pass^k, the chance that k trials drawn without replacement from
-- n, of which c succeeded, all succeed: C(c, k) / C(n, k) (the estimator τ-bench, Yao et
-- al. 2024, uses for reliability; ClawEval reports it too), computed as the product
-- prod_{i = 0}^{k - 1} (c - i) / (n - i). NULL when k < 1, k > n or c outside [0, n].
-- Grain: scalar.
CREATE OR REPLACE MACRO pass_hat_k(n, c, k) AS (
    CASE
        WHEN k < 1 OR k > n OR c < 0 OR c > n THEN NULL
        WHEN c < k THEN 0.0
        ELSE list_product([(c - i) / (n - i) for i in range(0, k)])
    END
)::DOUBLE
