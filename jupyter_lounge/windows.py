"""Who is at a lounge PC, seen from inside WSL2: the Windows side's sessions, games and GPU.

The node agent runs in WSL2, a VM in which the person playing is invisible, so it asks Windows
through WSL interop (which puts System32 on PATH): ``quser.exe``, ``tasklist.exe`` and
``nvidia-smi.exe``. This module parses their output and samples them; it is pure apart from
``sample()``, and it imports only the standard library, since the agent imports it before it
forks (no threads, nothing heavy).

Recorded outputs, with their sources, are in tests/data/windows/ (SOURCES.md there).
"""

from __future__ import annotations

import csv
import re
import subprocess
from dataclasses import dataclass

# Console programs write their pipe output in the OEM code page, cp850 in the Western
# European locales (cp437 in the US differs only in symbols): one byte is one character, so
# quser's columns stay where the header puts them, whatever bytes come.
OEM_ENCODING = "cp850"

# Process image names (as tasklist shows them) of games and of apps a person at the PC uses
# heavily. Checked against CachyOS/ananicy-rules (Games/wine_proton: cs2.exe, dota2.exe,
# r5apex.exe, r5apex_dx12.exe, Overwatch.exe, RocketLeague.exe, RainbowSix.exe, TslGame.exe,
# obs64.exe) and, for the games whose anti-cheat keeps them off Wine, against public
# game-detection lists (e.g. Min-Shung/Anti-addiction: VALORANT-Win64-Shipping.exe,
# LeagueClient.exe, FortniteClient-Win64-Shipping.exe). Minecraft Java Edition runs as
# javaw.exe, the Java runtime that any Java program runs as, so it is left out: a lounge that
# wants it adds it to its own list. Bedrock Edition has its own image name.
DEFAULT_GAMES: tuple[str, ...] = (
    "League of Legends.exe",  # League of Legends, in a game
    "LeagueClient.exe",  # League of Legends, its client (lobby, champion select)
    "VALORANT-Win64-Shipping.exe",  # VALORANT (VALORANT.exe only launches it)
    "cs2.exe",  # Counter-Strike 2
    "dota2.exe",  # Dota 2
    "r5apex.exe",  # Apex Legends
    "r5apex_dx12.exe",  # Apex Legends, DirectX 12
    "FortniteClient-Win64-Shipping.exe",  # Fortnite
    "Overwatch.exe",  # Overwatch 2
    "RocketLeague.exe",  # Rocket League
    "RainbowSix.exe",  # Rainbow Six Siege
    "TslGame.exe",  # PUBG: Battlegrounds
    "Minecraft.Windows.exe",  # Minecraft Bedrock Edition
    "obs64.exe",  # OBS Studio: someone streaming or recording at the PC
)

# WSL2's VM as Windows sees it: our engines' work is done inside it (vmmemWSL on Windows 11,
# vmmem before; microsoft/WSL#6881).
WSL_VM = ("vmmem", "vmmemwsl")

# Windows' own desktop, and the overlay the NVIDIA driver's app injects, hold a GPU context in
# every session, idle or not (recorded in tests/data/windows/nvidia_smi_apps_idle.csv), so they
# say nothing about who uses the GPU.
WINDOWS_DESKTOP = (
    "dwm.exe",
    "explorer.exe",
    "ShellHost.exe",
    "ShellExperienceHost.exe",
    "StartMenuExperienceHost.exe",
    "SearchHost.exe",
    "TextInputHost.exe",
    "LockApp.exe",
    "ApplicationFrameHost.exe",
    "SystemSettings.exe",
    "CrossDeviceResume.exe",
    "LogonUI.exe",
    "msedgewebview2.exe",  # the WebView2 runtime behind the widgets and the start menu
    "NVIDIA Overlay.exe",  # NVIDIA App
    "NVIDIA Share.exe",  # GeForce Experience, its predecessor
)

QUSER = ("quser.exe",)
TASKLIST = ("tasklist.exe", "/fo", "csv", "/nh")
GPU_QUERY = (
    "nvidia-smi.exe",
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
)
GPU_APPS_QUERY = (
    "nvidia-smi.exe",
    "--query-compute-apps=pid,process_name,used_memory",
    "--format=csv,noheader,nounits",
)

# quser's STATE column, localized (en, de, es, fr as recorded; see SOURCES.md).
_STATES = {
    "active": "active",
    "aktiv": "active",
    "activo": "active",
    "actif": "active",
    "disc": "disconnected",
    "getr.": "disconnected",
    "desc": "disconnected",
}
_IDLE = re.compile(r"(?:(\d+)\+)?(?:(\d+):)?(\d+)")


@dataclass(frozen=True)
class Session:
    """One line of ``quser``: a Windows logon session."""

    user: str  # quser cuts names at 20 characters; a name may hold spaces
    session: str  # "console", "rdp-tcp#0", or "" for a disconnected session
    id: int
    state: str  # "active", "disconnected", or the column's own word lower-cased
    idle_seconds: float | None  # None for "none" / "." (under a minute) / a localized "none"
    logon: str


def parse_quser(text: str) -> list[Session]:
    """Sessions from ``quser`` output, any language. A disconnected session has no session
    name, so its other columns shift left: the session name is read at the header's column,
    and what follows it (ID, state, idle, logon) by words."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    columns = [m.start() for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
    if len(columns) < 3:  # "No User exists for *", or anything else that is not the table
        return []
    sessions = (_session(line, columns[1]) for line in lines[1:])
    return [s for s in sessions if s is not None]


def _session(line: str, name_column: int) -> Session | None:
    words = line[name_column:].split()
    name = words.pop(0) if line[name_column : name_column + 1].strip() else ""
    if len(words) < 3 or not words[0].isdigit():
        return None
    state = words[1].lower()
    return Session(
        user=line[1:name_column].strip(),  # column 0 is ">" on the current session
        session=name,
        id=int(words[0]),
        state=_STATES.get(state, state),
        idle_seconds=_idle_seconds(words[2]),
        logon=" ".join(words[3:]),
    )


def _idle_seconds(text: str) -> float | None:
    """quser's IDLE TIME: minutes, h:mm, or days+h:mm; "none", "." and words are None."""
    m = _IDLE.fullmatch(text)
    if m is None:
        return None
    days, hours, minutes = (int(g or 0) for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60)


def console_session(sessions: list[Session]) -> Session | None:
    """The active session on the physical console: the person sitting at the PC."""
    return next(
        (s for s in sessions if s.session.lower() == "console" and s.state == "active"), None
    )


def people(sessions: list[Session]) -> list[Session]:
    """Everyone using the PC now: every session but a disconnected one, so the active console
    and active RDP sessions (a remote user feels the engines' load as much as one at the
    keyboard). A state word of a language _STATES lacks counts as a person too: wrongly busy
    is better than engines under a player. A locked console still reads "active"; its idle
    time would tell an absent player, but quser mostly reports none for the console."""
    return [s for s in sessions if s.state != "disconnected"]


def parse_tasklist_csv(text: str) -> list[dict]:
    """Processes from ``tasklist /fo csv /nh``; a header line or an "INFO: ..." line (any
    language) is skipped, and memory is read in any thousands separator."""
    tasks = []
    for row in csv.reader(text.splitlines()):
        if len(row) < 5 or not (row[1].isdigit() and row[3].isdigit()):
            continue
        digits = re.sub(r"\D", "", row[4])
        tasks.append(
            {
                "image": row[0],
                "pid": int(row[1]),
                "session_name": row[2],
                "session": int(row[3]),
                "mem_kib": int(digits) if digits else None,
            }
        )
    return tasks


def running_games(tasks: list[dict], games=DEFAULT_GAMES) -> list[str]:
    """The image names among ``games`` (any case, ".exe" optional) that run in a person's
    session: services run in session 0, so a game's updater there does not count."""
    wanted = {_stem(g) for g in games}
    found = [t["image"] for t in tasks if t["session"] > 0 and _stem(t["image"]) in wanted]
    return list(dict.fromkeys(found))


def _stem(name: str) -> str:
    name = re.split(r"[\\/]", name)[-1].lower()
    return name[:-4] if name.endswith(".exe") else name


def parse_gpu_csv(text: str) -> list[dict]:
    """GPUs from ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits``; "[N/A]" and "[Not Supported]" are None."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            continue
        util, used, total = (_number(f) for f in fields[1:])
        gpus.append(
            {
                "index": int(fields[0]),
                "util_percent": util,
                "memory_used_mib": used,
                "memory_total_mib": total,
            }
        )
    return gpus


def parse_gpu_apps_csv(text: str) -> list[dict]:
    """GPU processes from ``nvidia-smi --query-compute-apps=pid,process_name,used_memory
    --format=csv,noheader,nounits``. On Windows (WDDM) every process with a GPU context is
    listed, with its full path, and its memory is "[N/A]". A path may hold ", ", so the name
    is what lies between the first and the last field."""
    apps = []
    for line in text.splitlines():
        pid, _, rest = line.strip().partition(", ")
        name, _, memory = rest.rpartition(", ")
        if pid.isdigit() and name:
            apps.append({"pid": int(pid), "process_name": name, "used_memory_mib": _number(memory)})
    return apps


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def foreign_gpu(apps: list[dict], ours=WSL_VM, ignore=WINDOWS_DESKTOP) -> list[str]:
    """The GPU processes that are not ours (WSL's VM) and not Windows' own desktop, by image
    name. A name nvidia-smi may not read ("[Insufficient Permissions]", a protected system
    process) is skipped: a person's game shows up by name, and in tasklist."""
    skip = {_stem(n) for n in (*ours, *ignore)}
    names = (re.split(r"[\\/]", a["process_name"])[-1] for a in apps)
    return list(dict.fromkeys(n for n in names if not n.startswith("[") and _stem(n) not in skip))


def sample(run=subprocess.run, games=DEFAULT_GAMES, timeout: float = 5.0) -> dict:
    """One look at the Windows side: the people at the PC ("users"), the console's idle time,
    the programs running in people's sessions ("apps", image names) and those of them in
    ``games``, the GPUs, and "problems". A program that is missing, hangs or fails adds a
    sentence to "problems" and its part stays empty; nothing raises.

    A GPU's util_percent counts only while a foreign process holds the GPU ("foreign_gpu"):
    otherwise the load is our engines' (nvidia-smi cannot split it per process on Windows)
    and reads 0. "foreign_gpu" is None when the GPU's processes could not be listed; then the
    load counts, as it may be anyone's. quser reports no idle time for the console on
    Windows 10/11 (as recorded), so console_idle_seconds is mostly None while someone sits
    there."""
    problems: list[str] = []
    sessions = _quser(run, timeout, problems)
    tasks = _parsed(run, TASKLIST, timeout, problems, parse_tasklist_csv) or []
    gpus = _parsed(run, GPU_QUERY, timeout, problems, parse_gpu_csv) or []
    apps = _parsed(run, GPU_APPS_QUERY, timeout, problems, parse_gpu_apps_csv) if gpus else []
    foreign = None if apps is None else foreign_gpu(apps)
    console = console_session(sessions)
    return {
        "users": [s.user for s in people(sessions)],
        "console_idle_seconds": console.idle_seconds if console else None,
        "apps": list(dict.fromkeys(t["image"] for t in tasks if t["session"] > 0)),
        "games": running_games(tasks, games),
        "gpus": [{**g, "util_percent": g["util_percent"] if foreign != [] else 0} for g in gpus],
        "foreign_gpu": foreign,
        "problems": problems,
    }


def _quser(run, timeout: float, problems: list[str]) -> list[Session]:
    done = _call(run, QUSER, timeout, problems)
    if done is None:
        return []
    sessions = parse_quser(done.stdout)
    # With nobody logged on quser exits 1 and writes "No User exists for *" to stderr. The
    # message is localized; its end, the "*" quser was asked about, is taken to survive
    # translation, so that is what is checked rather than the English words.
    nobody = done.returncode == 1 and (done.stderr or "").strip().endswith("*")
    if done.returncode and not sessions and not nobody:
        problems.append(_failure(QUSER[0], done))
    return sessions


def _parsed(run, argv, timeout: float, problems: list[str], parse):
    """What ``parse`` makes of the program's output; None if it could not be run, or failed
    with nothing to parse."""
    done = _call(run, argv, timeout, problems)
    if done is None:
        return None
    parsed = parse(done.stdout)
    if done.returncode and not parsed:
        problems.append(_failure(argv[0], done))
        return None
    return parsed


def _call(run, argv, timeout: float, problems: list[str]):
    name = argv[0]
    try:
        return run(
            list(argv),
            capture_output=True,
            text=True,
            encoding=OEM_ENCODING,
            errors="replace",
            timeout=timeout,
        )
    except FileNotFoundError:
        problems.append(f"{name} is not on PATH (is WSL interop on, with Windows' PATH appended?).")
    except subprocess.TimeoutExpired:
        problems.append(f"{name} did not answer within {timeout:g} s.")
    except OSError as e:  # e.g. "Exec format error" once WSL interop is switched off
        problems.append(f"{name} could not be run: {e.strerror or e}.")
    return None


def _failure(name: str, done) -> str:
    said = (done.stderr or done.stdout or "").strip().splitlines()
    reason = said[0].strip().rstrip(".") if said else "no output"
    return f"{name} failed with exit code {done.returncode}: {reason}."
