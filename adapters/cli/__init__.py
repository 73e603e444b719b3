"""CLI-backed providers (`api = "cli"`): a Chat Completions request answered by running a coding
CLI headless — `claude -p`, `codex exec`, `gemini -p`, `opencode run`, `cursor-agent -p`.

brim serves a model, not an agent: the conversation (system prompt, turns, tool calls and their
results) is rendered into one prompt, sent on the CLI's stdin, with the CLI's own tools switched
off; the CLI's JSON (or stream-JSON) output is read line by line into Chat Completions — an SSE
stream, or one `chat.completion` — with the usage the CLI reports.

Each run gets a scratch working directory (removed after) and its own process group, killed
whole when the run times out (`timeout_s`, the whole run), when the client goes away, and after
the CLI exits (whatever it left running goes too). At most `max_concurrency` runs at once per
upstream; up to `max_queued` more wait at most `queue_timeout_s`, and any other request is
answered 429 with `retry-after`. The CLI's stderr is logged, never sent to the client; a failure
becomes the documented error: the CLI missing (502, naming the command), not logged in (401),
timed out (504), or its own "prompt is too long" — a `ContextOverflow`, so that learned limits
and the retry stage work as with any provider.

Each CLI is one entry of `CLIS`: how to build its command line and environment, and how to read
its output. The flags are those of the versions pinned in tests/real_clis.py.

The modules, in the order a run uses them: `command_line` (how each CLI is run, `CLIS`),
`prompt` (the conversation as one prompt), `process` (one run of the CLI), `readers` (its output
read into events), `failures` (what a failure becomes), `cli_adapter` (the adapter: the pool,
the request, the reply). The public names are re-exported here.
"""

from brim.adapters.cli.cli_adapter import CliAdapter
from brim.adapters.cli.command_line import BRIM_SETTINGS_ONLY, CLIS, ChildEnv, Cli, cli_model
from brim.adapters.cli.prompt import render_prompt

__all__ = [
    "BRIM_SETTINGS_ONLY",
    "CLIS",
    "ChildEnv",
    "Cli",
    "CliAdapter",
    "cli_model",
    "render_prompt",
]
