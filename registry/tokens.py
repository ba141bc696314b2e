"""API tokens stored hashed (issue 17, item 9).

DRF's authtoken keeps each key in clear as the row's primary key, so a copy of the database
(a backup, a replica) is every uploader's credential. Here the row holds a digest of the key
(sha256, the first 40 hex digits, which fit DRF's column): the key is shown once, when it is
made, and a presented key is hashed before the look-up. Keys are 160 random bits, so a fast
hash is enough (there is nothing to guess), and no server secret is involved (rotating
DJANGO_SECRET_KEY does not log every uploader out).

`Token.objects.create(user=...)` keeps working as before: the row stores the digest while the
returned object still carries the new key, once.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

__all__ = ["HashedTokenAuthentication", "issue_token", "token_digest"]


def token_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class HashedTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>``, looked up by the key's digest."""

    def authenticate_credentials(self, key: str) -> Any:
        return super().authenticate_credentials(token_digest(key))


@receiver(pre_save, sender=Token)
def _hash_new_key(sender: Any, instance: Token, **kwargs: Any) -> None:
    if instance._state.adding:
        if not instance.key:
            instance.key = instance.generate_key()
        instance._plain_key = instance.key  # type: ignore[attr-defined]
        instance.key = token_digest(instance.key)


@receiver(post_save, sender=Token)
def _show_new_key_once(sender: Any, instance: Token, created: bool, **kwargs: Any) -> None:
    plain = getattr(instance, "_plain_key", None)
    if created and plain:
        instance.key = plain  # this object only; the row keeps the digest
        del instance._plain_key  # type: ignore[attr-defined]


def issue_token(user: Any) -> str:
    """A new key for ``user`` (any previous one stops working); the only time it is shown."""
    Token.objects.filter(user=user).delete()
    return str(Token.objects.create(user=user).key)
