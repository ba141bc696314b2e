"""What the registry does, as plain functions the API, commands and tasks all call. The bundle
feature's own services (publish, describe, checkout, export, verify) live in registry/bundles/services/."""
