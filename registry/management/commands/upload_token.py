"""manage.py upload_token USERNAME: a new API token for a person or machine that uploads.

Creates the user (without a password: it only uploads) when missing, and prints a new token
alone, for ``Authorization: Token <key>``. Tokens are stored hashed (registry/tokens.py), so
an existing one cannot be shown again: running this again replaces it.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from registry.tokens import issue_token


class Command(BaseCommand):
    help = "Print a new upload token of USERNAME (replacing any previous one)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(username=options["username"])
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        self.stdout.write(issue_token(user))
