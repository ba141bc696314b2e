"""manage.py upload_token USERNAME: the API token a person or machine uploads bundles with.

Creates the user (without a password: it only uploads) and its token when missing, and
prints the token alone, for ``Authorization: Token <key>``.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Print the upload token of USERNAME, creating the user and token if needed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(username=options["username"])
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
