"""A broken invariant: its name, what broke it, and the kind of failure a shrink keeps."""

from __future__ import annotations


class Violation(AssertionError):
    def __init__(self, invariant: str, detail: str, kind: str = "") -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail
        self.kind = kind or invariant  # what a shrink keeps: the same kind of failure

    def __reduce__(self) -> tuple[type[Violation], tuple[str, str, str]]:
        return (Violation, (self.invariant, self.detail, self.kind))  # across processes
