-- A group's statistics are its members': every row of a group reports the same size,
-- mean and std, and the size is the number of its rollouts not dropped before grouping.
-- Returns groups where that fails.
SELECT group_id, list(DISTINCT group_size) AS sizes, count(*) FILTER (
    WHERE drop_reason IS NULL OR drop_reason IN ('zero_spread', 'single_member')
) AS members
FROM groups
GROUP BY group_id
HAVING count(DISTINCT group_size) > 1
    OR count(DISTINCT group_mean) > 1
    OR count(DISTINCT group_std) > 1
    OR any_value(group_size) <> count(*) FILTER (
        WHERE drop_reason IS NULL OR drop_reason IN ('zero_spread', 'single_member')
    )
