"""The registry: published bundles, their verification, storage, REST API and lookups."""
