"""Lookups over REST: the one door (``http``) and the service behind it (``services``)."""
