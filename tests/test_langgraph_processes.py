"""Two processes on one SQLite file run a LangGraph thread at once: each process has its
own saver and registry, the thread's session is held by one of them and the other's
calls go through it, runs take turns across the processes, and no turn is lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bounds import INTERPRETER_BOUND as BOUND

from nous_actor.integrations.langgraph import NousCheckpointSaver

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
TURNS = 40

_WORKER = textwrap.dedent(
    """
    import sys
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from nous_actor.integrations.langgraph import NousCheckpointSaver

    path, name, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def answer(state):
        return {"messages": [AIMessage("re: " + state["messages"][-1].content)]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    with NousCheckpointSaver.from_conn_string(path) as saver:
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "shared"}}
        for i in range(turns):
            app.invoke({"messages": [HumanMessage(f"{name}-{i}")]}, config)
    print("done", name)
    """
)


def test_two_processes_on_one_file_lose_no_turn(tmp_path: Path) -> None:
    """Each process runs its turns on one thread at the same time as the other: every
    question and its answer is in the final state, in pairs, and the history is one line."""
    path = tmp_path / "checkpoints.db"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(path), name, str(TURNS)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("p", "q")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=BOUND * 2)
        assert proc.returncode == 0, err[-3000:]
        assert out.startswith("done")
    with NousCheckpointSaver.from_conn_string(path) as saver:
        latest = saver.get_tuple({"configurable": {"thread_id": "shared"}})
        history = list(saver.list({"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}))
    assert latest is not None
    said = [str(m.content) for m in latest.checkpoint["channel_values"]["messages"]]
    assert sorted(said[0::2]) == sorted(f"{n}-{i}" for n in "pq" for i in range(TURNS))
    assert said[1::2] == [f"re: {s}" for s in said[0::2]]
    assert len(history) == 3 * 2 * TURNS  # one line: input, start, answer per run
    parents = [
        t.parent_config["configurable"]["checkpoint_id"] for t in history if t.parent_config
    ]
    assert len(set(parents)) == len(parents)  # no checkpoint has two children: no fork
