"""Pages for people: the dashboard (bundles, tables and their figures, compare, jobs)."""
