"""When a provider's overflow error may teach brim something every client then lives with.

A learned fact (a model's window; that its output limit shares the window) is shared by every
request for a day, on every instance. The error that states it is text a client can influence —
a provider quotes back the name of a field it does not know — so a fact is learned only where
brim's own measurement of the request it sent bears the error out:

- brim's count of that request (with its output limit where the provider counts it, and what a
  CLI adds) is close to the stated window or above it: within `RATIO` below it at most;
- the provider's own count of the request, where the error states one, is within `RATIO` of
  brim's;
- that the output limit shares the window, only where the error names the very output limit the
  request set.

The window must also lie within the registry's bounds (`LimitsRegistry.implausible`).
"""

from __future__ import annotations

from dataclasses import dataclass

RATIO = 2.0  # how far brim's count and the provider's may lie apart


@dataclass(frozen=True, slots=True)
class Sent:
    """brim's own measurement of a request the provider refused as too long."""

    tokens: int  # brim's count of the input it sent
    output: int | None = None  # the request's own output limit (`max_tokens` …), if it set one
    overhead: int = 0  # what a CLI adds to the request that brim's count leaves out

    def span(self, *, output_counts: bool) -> tuple[int, int]:
        """The least and the most the provider may have counted for this request."""
        most = self.tokens + self.overhead + ((self.output or 0) if output_counts else 0)
        return self.tokens, most


def window_unproven(
    stated: int, provider_count: int | None, sent: Sent, *, output_counts: bool
) -> str | None:
    """Why brim's measurement does not bear out a stated window, or None if it does."""
    least, most = sent.span(output_counts=output_counts)
    if most * RATIO < stated:
        return f"brim sent {most} tokens, far below the {stated}-token window the error states"
    if provider_count is not None and not least / RATIO <= provider_count <= most * RATIO:
        return (
            f"the provider's count of the request ({provider_count}) is far from brim's "
            f"({least}-{most})"
        )
    return None


def output_counts_unproven(stated_output: int | None, sent: Sent) -> str | None:
    """Why brim's measurement does not bear out that the output limit shares the window, or
    None if it does: the error must name the output limit the request set."""
    if sent.output is None:
        return "the request set no output limit"
    if stated_output != sent.output:
        return (
            f"the error's output figure ({stated_output}) is not the request's output limit "
            f"({sent.output})"
        )
    return None
