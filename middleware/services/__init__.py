"""What the stages use and share: the status board and instruments, the Redis link and the
state shared through it, the stores, the archive, the audit log, the summarizer, and reading a
reply's usage."""
