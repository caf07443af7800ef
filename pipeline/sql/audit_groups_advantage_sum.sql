-- Advantages of an included group of two or more members sum to zero (each is its
-- reward minus the group's mean, scaled by one number), up to rounding. Returns groups
-- whose sum is off.
SELECT group_id, sum(advantage) AS advantage_sum, count(*) AS members
FROM groups
WHERE included AND group_size > 1
GROUP BY group_id
HAVING abs(sum(advantage)) > 1e-9 * count(*) * greatest(1.0, max(abs(advantage)))
