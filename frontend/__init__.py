"""Pages for people. For now a landing page; the dashboard comes later."""
