"""manage.py create_user USERNAME: an ordinary account that can sign in to the dashboard.

Not staff, not a superuser: it queues jobs and requests coverage, and changes only its own jobs.
The password is asked twice on a terminal, or read from the first line of stdin with
``--password-stdin`` (for scripts).
"""

from __future__ import annotations

import getpass
import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Create an ordinary (non-staff) user who can sign in to the dashboard."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default="")
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from the first line of stdin",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        username = options["username"]
        if users.objects.filter(username=username).exists():
            raise CommandError(f"a user {username!r} exists already")
        if options["password_stdin"]:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass(f"password for {username}: ")
            if getpass.getpass("again: ") != password:
                raise CommandError("the two passwords differ")
        user = users(username=username, email=options["email"])
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        user.set_password(password)
        user.save()
        self.stdout.write(f"created {username}: sign in at /accounts/login/")
