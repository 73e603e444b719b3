"""`brim limits`: list what a running brim learned from providers' overflow errors
(`GET /admin/limits`), and forget it (`brim limits forget MODEL`, `--all`:
`DELETE /admin/limits[/MODEL]`), on every instance and worker that shares it."""

from __future__ import annotations

import urllib.parse
from typing import Any

from brim.proxy.status_view import admin_call, duration, table

SHARED_WITH = {
    "instances": "every instance on its Redis drops it within its refresh_s",
    "workers": "every worker drops it within a second",
}


def fetch_limits(url: str, admin_key: str) -> dict[str, Any]:
    return admin_call(url, admin_key, "/admin/limits")


def forget_limits(url: str, admin_key: str, model: str | None) -> dict[str, Any]:
    """Forget what `model` taught brim (None: every model)."""
    path = "/admin/limits" if model is None else f"/admin/limits/{urllib.parse.quote(model, '')}"
    return admin_call(url, admin_key, path, method="DELETE")


def _fact(row: dict[str, Any]) -> str:
    if row.get("kind") == "window":
        return f"window {row.get('value', 0):,}"
    return "output counts against the window"


def _known(row: dict[str, Any]) -> str:
    return f"{row.get('known', 0):,} ({row.get('known_source')})"


def render_limits(listing: dict[str, Any], url: str) -> str:
    rows = listing.get("learned") or []
    shared = listing.get("shared_with")
    out = [
        f"Learned limits at {url}" + (f" (shared by its {shared})" if shared else ""),
        *table(
            ("model", "fact", "known without it", "learned", "expires in"),
            [
                (
                    row.get("model"),
                    _fact(row),
                    _known(row),
                    f"{duration(row.get('learned_s_ago') or 0)} ago",
                    duration(row.get("expires_in_s") or 0),
                )
                for row in rows
            ],
            empty="nothing learned from providers",
        ),
    ]
    if rows:
        out += ["", "Forget one with: brim limits forget MODEL (or --all)"]
    return "\n".join(out)


def render_forgotten(done: dict[str, Any]) -> str:
    model = done.get("model")
    what = "every model" if model is None else repr(model)
    rows = done.get("forgotten") or []
    out = [
        f"Forgot what was learned of {what} here: {len(rows)} fact(s)"
        + "".join(f"\n  {row.get('model')}: {_fact(row)}" for row in rows)
    ]
    shared = done.get("shared_with")
    if shared in SHARED_WITH:
        if done.get("reached"):
            out.append(f"Told the others: {SHARED_WITH[shared]}.")
        else:
            out.append(
                f"The other {shared} could not be told now (is Redis up?); brim tells them "
                "once it reaches them."
            )
    return "\n".join(out)
