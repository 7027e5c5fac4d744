"""The ops dashboard's front-end assets.

Vendored, pinned files (see ``static/vendor/VENDORED.md``) served by the app itself, so the
dashboard needs no build step and no CDN.
"""
