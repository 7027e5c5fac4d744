"""Who may call the service: API keys with scopes, dashboard sessions and CSRF tokens."""

from service.auth.keys import IssuedKey, KeyExists, KeyRing, create_key, revoke
from service.auth.scopes import SCOPES, granted

__all__ = ["SCOPES", "IssuedKey", "KeyExists", "KeyRing", "create_key", "granted", "revoke"]
