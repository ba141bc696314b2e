"""Tokens stored before registry/tokens.py are re-stored as digests (issue 17, item 9): the
same keys keep working, and the database no longer holds them in clear."""

import hashlib
from typing import Any

from django.db import migrations


def hash_existing_keys(apps: Any, schema_editor: Any) -> None:
    Token = apps.get_model("authtoken", "Token")
    for token in list(Token.objects.all()):
        digest = hashlib.sha256(token.key.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        user_id, created = token.user_id, token.created
        token.delete()
        Token.objects.create(key=digest, user_id=user_id, created=created)


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0004_measured_at_range"),
        ("authtoken", "0004_alter_tokenproxy_options"),
    ]

    operations = [migrations.RunPython(hash_existing_keys, migrations.RunPython.noop)]
