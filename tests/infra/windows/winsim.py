"""What the Windows stand-ins share: the state folder a test writes, the recorded samples
they copy their format from, and writing as Windows programs do (CRLF, OEM code page)."""

import os
import sys
from pathlib import Path

# Next to tests/infra/windows, unless the stand-ins are reached through a bind mount (a
# testbed node's PATH): then the test names the folder in the state file "samples".
HERE_DATA = Path(__file__).resolve().parents[2] / "data" / "windows"


def state(name: str) -> str:
    """A state file's text, stripped; "" when it is absent. Read at each call: each testbed
    node sees its own /var/local, and a test may point LOUNGE_WINSIM_DIR elsewhere."""
    path = Path(os.environ.get("LOUNGE_WINSIM_DIR", "/var/local/winsim")) / name
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def state_lines(name: str) -> list[str]:
    return [line.strip() for line in state(name).splitlines() if line.strip()]


def sample(name: str) -> list[str]:
    """The lines of a recorded sample in tests/data/windows."""
    folder = Path(state("samples") or HERE_DATA)
    return (folder / name).read_bytes().decode("cp850").splitlines()


def write(lines: list[str], stream=None, encoding: str = "cp850") -> None:
    """Lines with CRLF endings, encoded as the real program writes them."""
    out = stream or sys.stdout
    out.buffer.write("".join(f"{line}\r\n" for line in lines).encode(encoding))
    out.flush()
