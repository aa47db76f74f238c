"""What the agent sees of a Windows lounge PC from inside WSL2 (windows.py): quser, tasklist
and nvidia-smi output recorded from real machines (tests/data/windows, SOURCES.md there),
sample() with a fake run, and the stand-ins of tests/infra/windows run for real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from jupyter_lounge import windows
from jupyter_lounge.windows import Session

pytestmark = pytest.mark.fast

DATA = Path(__file__).parent / "data" / "windows"
STANDINS = Path(__file__).parent / "infra" / "windows"


def recorded(name: str) -> str:
    """A sample as sample() reads its program's output: OEM code page, CRLF kept."""
    return (DATA / name).read_bytes().decode(windows.OEM_ENCODING)


# ---- quser -------------------------------------------------------------------------------


def test_quser_english_console_session():
    assert windows.parse_quser(recorded("quser_en_console.txt")) == [
        Session("wchesley", "console", 1, "active", None, "7/24/2024 7:36 AM")
    ]


def test_quser_disconnected_session_shifts_its_columns_and_keeps_a_spaced_name():
    # Split on spaces, this line would be user "ben" in session "bolen": the header's columns
    # say where the user name ends and the (empty) session name is.
    assert windows.parse_quser(recorded("quser_en_disconnected.txt")) == [
        Session("ben bolen", "", 2, "disconnected", (24 * 60 + 53) * 60.0, "9/16/2026 9:33 AM")
    ]


def test_quser_german():
    assert windows.parse_quser(recorded("quser_de_console.txt")) == [
        Session("manfred", "console", 4, "active", None, "28.04.2025 12:03")
    ]


def test_quser_spanish_with_a_spaced_header_and_a_disconnected_session():
    assert windows.parse_quser(recorded("quser_es_console_disc.txt")) == [
        Session("mabe-b3", "console", 1, "active", None, "7/25/2018 7:46 AM"),
        Session("otro00", "", 2, "disconnected", 120.0, "7/25/2018 10:51 AM"),
    ]


def row(user: str, session: str, id: int, state: str, idle: str) -> str:
    """A quser row in the recorded columns (see SOURCES.md); a numeric idle time is
    right-aligned, as quser does."""
    return f" {user:<22}{session:<18}{id:>3}  {state:<8}{idle:>9}  1/2/2026 3:04 PM"


def table(*rows: str) -> str:
    header = recorded("quser_en_console.txt").splitlines()[0]
    return "".join(f"{line}\r\n" for line in (header, *rows))


@pytest.mark.parametrize(
    "idle, seconds",
    [
        ("none", None),
        ("Kein", None),
        (".", None),
        ("5", 300.0),
        ("1:02", 3720.0),
        ("2+03:04", ((2 * 24 + 3) * 60 + 4) * 60.0),
    ],
)
def test_quser_idle_formats(idle, seconds):
    [session] = windows.parse_quser(table(row("gamer", "rdp-tcp#0", 3, "Active", idle)))
    assert (session.session, session.id, session.idle_seconds) == ("rdp-tcp#0", 3, seconds)


def test_quser_state_word_of_another_language_is_kept_and_counts_as_a_person():
    [session] = windows.parse_quser(table(row("gamer", "console", 1, "Attivo", "none")))
    assert session.state == "attivo" and windows.people([session]) == [session]


@pytest.mark.parametrize("text", ["", "\r\n", "No User exists for *\r\n"])
def test_quser_nobody(text):
    assert windows.parse_quser(text) == []


def test_console_session_and_people():
    console = Session("alice", "console", 1, "active", None, "")
    remote = Session("bob", "rdp-tcp#0", 2, "active", 60.0, "")
    gone = Session("carol", "", 3, "disconnected", 9000.0, "")
    assert windows.console_session([remote, gone, console]) == console
    assert windows.console_session([remote, gone]) is None
    assert windows.people([console, remote, gone]) == [console, remote]


# ---- tasklist ----------------------------------------------------------------------------


def test_tasklist_english():
    tasks = windows.parse_tasklist_csv(recorded("tasklist_en.csv"))
    assert len(tasks) == 14
    assert tasks[1] == {
        "image": "System",
        "pid": 4,
        "session_name": "Services",
        "session": 0,
        "mem_kib": 2868,
    }
    assert tasks[3]["image"] == "smss.exe" and tasks[3]["mem_kib"] is None  # "N/A"
    assert tasks[6] == {
        "image": "csrss.exe",
        "pid": 764,
        "session_name": "Console",
        "session": 1,
        "mem_kib": 1484,
    }


def test_tasklist_german_with_its_header_line():
    tasks = windows.parse_tasklist_csv(recorded("tasklist_de_header.csv"))
    assert [(t["image"], t["pid"], t["mem_kib"]) for t in tasks] == [
        ("System Idle Process", 0, 8),
        ("System", 4, 13160),
        ("Registry", 144, 15132),
        ("smss.exe", 688, 1116),
        ("csrss.exe", 976, 5412),
        ("wininit.exe", 488, 6120),
    ]


def test_tasklist_memory_in_any_thousands_separator_and_info_lines():
    text = (
        "INFO: No tasks are running which match the specified criteria.\r\n"
        '"a.exe","1","Console","1","12,345 K"\r\n'
        '"b.exe","2","Console","1","12.345 K"\r\n'
        '"c.exe","3","Console","1","12\u00a0345 K"\r\n'  # French: a no-break space
    )
    assert [t["mem_kib"] for t in windows.parse_tasklist_csv(text)] == [12345] * 3


def test_running_games_only_in_a_persons_session():
    tasks = windows.parse_tasklist_csv(recorded("tasklist_en_games.csv"))
    # RocketLeague.exe runs in session 0 (services): not a person playing.
    assert windows.running_games(tasks) == ["cs2.exe", "obs64.exe"]
    assert windows.running_games(tasks, games=["CS2", "rocketleague.exe"]) == ["cs2.exe"]
    assert windows.running_games(windows.parse_tasklist_csv(recorded("tasklist_en.csv"))) == []


# ---- nvidia-smi --------------------------------------------------------------------------


def test_gpu_rows_recorded():
    assert windows.parse_gpu_csv(recorded("nvidia_smi_gpu_idle.csv")) == [
        {"index": 0, "util_percent": 0, "memory_used_mib": 797, "memory_total_mib": 8192}
    ]
    assert windows.parse_gpu_csv(recorded("nvidia_smi_gpu_load.csv"))[0]["util_percent"] == 7


def test_gpu_rows_not_available():
    text = "0, [N/A], 512, 8192\r\n1, [Not Supported], [N/A], [N/A]\r\n"
    assert windows.parse_gpu_csv(text) == [
        {"index": 0, "util_percent": None, "memory_used_mib": 512, "memory_total_mib": 8192},
        {"index": 1, "util_percent": None, "memory_used_mib": None, "memory_total_mib": None},
    ]


def test_gpu_apps_recorded_on_wddm():
    apps = windows.parse_gpu_apps_csv(recorded("nvidia_smi_apps_load.csv"))
    assert len(apps) == 21
    assert apps[0] == {
        "pid": 2140,
        "process_name": r"C:\Windows\System32\dwm.exe",
        "used_memory_mib": None,
    }
    assert apps[-1]["process_name"].endswith(r"\bin\ffmpeg.exe")


def test_foreign_gpu_leaves_out_wsl_and_the_windows_desktop():
    idle = windows.parse_gpu_apps_csv(recorded("nvidia_smi_apps_idle.csv"))
    # The recorded desktop had a user's tray apps open; the desktop's own processes are gone.
    assert windows.foreign_gpu(idle) == [
        "ControllerCompanion.exe",
        "PhoneExperienceHost.exe",
        "1Password.exe",
        "msedge.exe",
        "WindowsTerminal.exe",
    ]
    ours = "1, vmmemWSL, [N/A]\r\n2, vmmem, [N/A]\r\n3, [Insufficient Permissions], [N/A]\r\n"
    assert windows.foreign_gpu(windows.parse_gpu_apps_csv(ours)) == []
    game = r"4, C:\Games\Steam\steamapps\common\cs2\game\bin\win64\cs2.exe, [N/A]"
    assert windows.foreign_gpu(windows.parse_gpu_apps_csv(ours + game)) == ["cs2.exe"]


# ---- sample() with a fake run -----------------------------------------------------------


def fake_run(answers: dict):
    """A run() that answers each program by name: a CompletedProcess, or an exception."""
    calls = []

    def run(argv, **kwargs):
        calls.append((argv, kwargs))
        answer = answers[argv[0]] if argv[0] != "nvidia-smi.exe" else answers[argv[1]]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    run.calls = calls
    return run


def done(stdout: str = "", code: int = 0, stderr: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], code, stdout, stderr)


def answers() -> dict:
    """Every program answering as recorded: a player at the console, in a game."""
    return {
        "quser.exe": done(recorded("quser_en_console.txt")),
        "tasklist.exe": done(recorded("tasklist_en_games.csv")),
        windows.GPU_QUERY[1]: done(recorded("nvidia_smi_gpu_load.csv")),
        windows.GPU_APPS_QUERY[1]: done("1, vmmemWSL, [N/A]\r\n"),
    }


def test_sample_a_player_at_the_console():
    run = fake_run(answers())
    assert windows.sample(run) == {
        "users": ["wchesley"],
        "console_idle_seconds": None,
        "apps": ["csrss.exe", "winlogon.exe", "fontdrvhost.exe", "cs2.exe", "obs64.exe"],
        "games": ["cs2.exe", "obs64.exe"],
        "gpus": [
            {
                "index": 0,
                "util_percent": 0,  # only WSL's VM holds the GPU: the load is ours
                "memory_used_mib": 1366,
                "memory_total_mib": 8192,
            }
        ],
        "foreign_gpu": [],
        "problems": [],
    }
    assert [argv for argv, _ in run.calls] == [
        list(windows.QUSER),
        list(windows.TASKLIST),
        list(windows.GPU_QUERY),
        list(windows.GPU_APPS_QUERY),
    ]
    assert all(kw["timeout"] == 5.0 and kw["encoding"] == "cp850" for _, kw in run.calls)


def test_sample_counts_the_gpu_load_when_someone_else_holds_the_gpu():
    apps = done(recorded("nvidia_smi_apps_load.csv"))
    found = windows.sample(fake_run(answers() | {windows.GPU_APPS_QUERY[1]: apps}))
    assert found["gpus"][0]["util_percent"] == 7 and "ffmpeg.exe" in found["foreign_gpu"]


def test_sample_nobody_logged_on_is_no_user_not_a_problem():
    nobody = done("", 1, "No User exists for *\r\n")
    found = windows.sample(fake_run(answers() | {"quser.exe": nobody}))
    assert (found["users"], found["console_idle_seconds"], found["problems"]) == ([], None, [])


def test_sample_a_disconnected_player_is_nobody():
    away = done(recorded("quser_en_disconnected.txt"))
    found = windows.sample(fake_run(answers() | {"quser.exe": away}))
    assert found["users"] == [] and found["problems"] == []


@pytest.mark.parametrize(
    "program, answer, problem",
    [
        (
            "quser.exe",
            FileNotFoundError(2, "No such file or directory"),
            "quser.exe is not on PATH (is WSL interop on, with Windows' PATH appended?).",
        ),
        (
            "tasklist.exe",
            subprocess.TimeoutExpired(["tasklist.exe"], 5.0),
            "tasklist.exe did not answer within 5 s.",
        ),
        (
            "quser.exe",
            OSError(8, "Exec format error"),
            "quser.exe could not be run: Exec format error.",
        ),
        (
            "quser.exe",
            done("", 1, "Error [5]:Access is denied.\r\n"),
            "quser.exe failed with exit code 1: Error [5]:Access is denied.",
        ),
        (
            windows.GPU_QUERY[1],
            done(
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                "driver. Make sure that the latest NVIDIA driver is installed and running.\r\n",
                9,
            ),
            "nvidia-smi.exe failed with exit code 9: NVIDIA-SMI has failed because it "
            "couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
            "driver is installed and running.",
        ),
    ],
)
def test_sample_a_program_that_fails_is_a_problem_sentence(program, answer, problem):
    found = windows.sample(fake_run(answers() | {program: answer}))
    assert found["problems"] == [problem]


def test_sample_gpu_apps_unknown_count_the_load():
    failed = done("", 15, "Failed to initialize NVML: Unknown Error\r\n")
    found = windows.sample(fake_run(answers() | {windows.GPU_APPS_QUERY[1]: failed}))
    assert found["gpus"][0]["util_percent"] == 7 and found["foreign_gpu"] is None
    assert found["problems"] == [
        "nvidia-smi.exe failed with exit code 15: Failed to initialize NVML: Unknown Error."
    ]


def test_sample_without_a_gpu_asks_no_process_list():
    run = fake_run(answers() | {windows.GPU_QUERY[1]: FileNotFoundError()})
    found = windows.sample(run)
    assert found["gpus"] == [] and len(run.calls) == 3
    assert found["problems"] == [
        "nvidia-smi.exe is not on PATH (is WSL interop on, with Windows' PATH appended?)."
    ]


# ---- the stand-ins, run for real ---------------------------------------------------------


@pytest.fixture
def winsim(tmp_path, monkeypatch):
    """A state folder for the stand-ins, and System32 on PATH as WSL interop puts it."""
    monkeypatch.setenv("LOUNGE_WINSIM_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}:{STANDINS / 'system32'}")
    return tmp_path


def test_standin_quser_prints_the_recorded_format(winsim):
    (winsim / "console_user").write_text("wchesley\n")
    (winsim / "console_logon").write_text("7/24/2024 7:36 AM\n")
    out = subprocess.run(["quser.exe"], capture_output=True, check=True).stdout
    # Byte for byte the recorded output, but for the ">" of the session quser ran in.
    assert out == (DATA / "quser_en_console.txt").read_bytes().replace(b"\n>", b"\n ")
    (winsim / "console_idle_minutes").write_text("1493\n")
    out = subprocess.run(["quser.exe"], capture_output=True, text=True).stdout
    recorded_row = recorded("quser_en_disconnected.txt").splitlines()[1]
    assert out.splitlines()[1][54:65] == recorded_row[54:65] == "  1+00:53  "


def test_standin_quser_with_nobody(winsim):
    found = subprocess.run(["quser.exe"], capture_output=True)
    assert (found.returncode, found.stdout, found.stderr) == (1, b"", b"No User exists for *\r\n")


def test_sample_through_the_standins(winsim):
    (winsim / "console_user").write_text("gamer\n")
    (winsim / "console_idle_minutes").write_text("12\n")
    (winsim / "games").write_text("cs2.exe\nnotepad.exe\n")
    (winsim / "gpu_util").write_text("93\n")
    (winsim / "gpu_apps").write_text(
        "C:\\Windows\\System32\\dwm.exe\nC:\\Games\\cs2\\game\\bin\\win64\\cs2.exe\n"
    )
    assert windows.sample() == {
        "users": ["gamer"],
        "console_idle_seconds": 720.0,
        "apps": ["cs2.exe", "notepad.exe"],
        "games": ["cs2.exe"],
        "gpus": [
            {"index": 0, "util_percent": 93, "memory_used_mib": 797, "memory_total_mib": 8192}
        ],
        "foreign_gpu": ["cs2.exe"],
        "problems": [],
    }
    for name in ("console_user", "games", "gpu_apps"):
        (winsim / name).unlink()
    found = windows.sample(games=())
    assert (found["users"], found["apps"], found["gpus"][0]["util_percent"]) == ([], [], 0)


def test_standins_refuse_what_they_do_not_simulate(winsim):
    found = subprocess.run(["nvidia-smi.exe", "-q"], capture_output=True, text=True)
    assert found.returncode != 0 and "only these are simulated" in found.stderr
    found = subprocess.run(["tasklist.exe", "/v"], capture_output=True, text=True)
    assert found.returncode != 0 and "/fo csv /nh" in found.stderr


def wsl(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(STANDINS / "wsl.exe"), *args],
        capture_output=True,
        env={**os.environ, **env},
    )


def test_standin_wsl_lists_distros_in_utf16(winsim):
    (winsim / "distros").write_text("Ubuntu\nDebian\n")
    assert wsl("-l", "-q").stdout == "Ubuntu\r\nDebian\r\n".encode("utf-16-le")
    assert wsl("-l", "-q", WSL_UTF8="1").stdout == b"Ubuntu\r\nDebian\r\n"
    assert wsl("--status").stdout.decode("utf-16-le").startswith("Default Distribution: Ubuntu")


def test_standin_wsl_runs_a_program_in_a_known_distro_only(winsim):
    (winsim / "distros").write_text("Ubuntu\n")
    (winsim / "console_user").write_text("gamer\n")
    # quser.exe is found on the System32 that wsl.exe adds, not on the caller's PATH.
    found = wsl("-d", "Ubuntu", "--exec", "quser.exe", PATH="/usr/bin:/bin")
    assert found.returncode == 0 and b" gamer " in found.stdout
    found = wsl("-d", "Kali", "--exec", "quser.exe")
    assert found.returncode == 255
    assert found.stdout.decode("utf-16-le") == (
        "There is no distribution with the supplied name.\r\n"
        "Error code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND\r\n"
    )
