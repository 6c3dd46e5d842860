-- The admin base's own statements (core.admin). Blocks start with `-- name: description`.

-- planner_estimate: the planner's row estimate for an admin list, without running it ({statement}
-- is the list's SQL from Django, its values bound as parameters)
explain (format json) {statement};
