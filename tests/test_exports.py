"""The public surface of nous_actor: a pinned, alphabetised __all__ and a light core import."""

from __future__ import annotations

import subprocess
import sys

import nous_actor

EXPECTED = [
    "Backoff",
    "CALL_RECORD_SECONDS",
    "CallOutcomeUnknown",
    "CallTimeout",
    "ChildSpec",
    "ClusterError",
    "CodecError",
    "CompactionError",
    "CompactionResult",
    "Compactor",
    "ConflictError",
    "DispatchedActor",
    "DispatchedSupervisedActor",
    "Dispatcher",
    "Event",
    "EventType",
    "FencedError",
    "FrozenDict",
    "FrozenList",
    "InvalidEvent",
    "Log",
    "MemoryStore",
    "Message",
    "NousActorError",
    "RegistryActor",
    "Replace",
    "RestartIntensityExceeded",
    "RestartPolicy",
    "Role",
    "SQLiteStore",
    "Session",
    "SessionActor",
    "SessionCrashed",
    "SessionError",
    "SessionFuture",
    "SessionHandle",
    "SessionInfo",
    "SessionReader",
    "SessionStopped",
    "Sessions",
    "Store",
    "StoreError",
    "Subscription",
    "SubscriptionLagged",
    "SupervisedActor",
    "Supervisor",
    "TooManySessions",
    "Turn",
    "TurnBusy",
    "TurnInterrupted",
    "UnsendableMessage",
    "__version__",
    "estimate_tokens",
    "list_sessions",
]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_all_is_pinned() -> None:
    """nous_actor.__all__ is exactly the reviewed list of public names."""
    assert nous_actor.__all__ == EXPECTED


def test_all_is_alphabetised() -> None:
    """__all__ is sorted and has no duplicates."""
    assert nous_actor.__all__ == sorted(set(nous_actor.__all__))


def test_every_exported_name_is_importable() -> None:
    """Each name in __all__ comes in with `from nous_actor import *`."""
    namespace: dict[str, object] = {}
    exec("from nous_actor import *", namespace)
    missing = [name for name in nous_actor.__all__ if name not in namespace]
    assert missing == []


def test_no_private_names_are_exported() -> None:
    """No exported name starts with a single underscore (dunders like __version__ are public)."""
    private = [n for n in nous_actor.__all__ if n.startswith("_") and not n.endswith("__")]
    assert private == []


def test_version_is_a_non_empty_string() -> None:
    """__version__ is a non-empty str."""
    assert isinstance(nous_actor.__version__, str)
    assert nous_actor.__version__


def test_exported_classes_are_defined_in_the_package() -> None:
    """Every exported class is defined inside the nous_actor package, not in a dependency."""
    foreign = [
        name
        for name in nous_actor.__all__
        if isinstance(obj := getattr(nous_actor, name), type)
        and not obj.__module__.startswith("nous_actor.")
    ]
    assert foreign == []


def test_core_import_does_not_import_hypothesis() -> None:
    """Importing nous_actor and its codec loads no Hypothesis (a test-only dependency)."""
    result = _run(
        "import sys, nous_actor, nous_actor.core.codec; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'hypothesis'); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_testing_module_does_import_hypothesis() -> None:
    """nous_actor.testing imports Hypothesis, so the check above can tell the two apart."""
    result = _run(
        "import sys, nous_actor.testing; sys.exit(0 if 'hypothesis' in sys.modules else 1)"
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_postgres_store_is_exported_lazily() -> None:
    """nous_actor.PostgresStore is the store's class; importing nous_actor loads no psycopg."""
    result = _run(
        "import sys, nous_actor; assert 'psycopg' not in sys.modules; "
        "from nous_actor import PostgresStore; "
        "assert PostgresStore.__module__ == 'nous_actor.store.postgres'"
    )
    assert result.returncode == 0, result.stdout + result.stderr
