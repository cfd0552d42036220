"""A container's output kept on its node after the container is gone. eugr's `docker run --rm` (kept exact) removes the
container, and its `docker logs` with it, the moment Ray or vLLM's main process dies: the very log a failed serve
needs. So beside each container the Docker runtime starts a follower, detached from the SSH session, that copies
`docker logs -f` (and the log vLLM beside Ray writes inside vllm_node) into the serve state directory, where the host
runtime writes its processes' logs: both runtimes leave `<role>.log` in one place. `logs` (and the root-cause reading
of a failed start) falls back to it once the container is gone.

The kept log is bounded for a serve that runs for weeks: `split` cuts the stream into chunks of KEPT_CHUNK_BYTES,
each written over `<role>.log` after the one before moved to `<role>.log.1`, so the node keeps the last one to two
chunks. No timestamps are added (`docker logs --timestamps`): the kept lines read exactly as the container's did, and
vLLM's carry their own. The host runtime's processes write into the same keeper, through a fifo (keep_host_output): a
plain `> <role>.log` had no bound, and any client on the LAN grew it 18 MB in 2.4 s through vLLM's access log.

What is kept is private: a client's prompt or completion may be in it. The keeper and the files it makes are created
under umask 077, in a state directory of mode 0700. Shell text only: runtime.py joins it to its commands."""

from __future__ import annotations

import shlex

from ..engine.command import shell_path

SERVE_STATE_DIR = "~/.cache/sparkcluster/serve"  # <role>.log (either runtime); the host runtime's <role>.pid
KEPT_CHUNK_BYTES = 8 << 20  # the kept log is the last 8 to 16 MiB of the container's output
KEEPER_STOP_S = 5  # how long down lets a keeper copy the container's last lines before it is stopped
GONE_NOTICE = "the container is gone; its last output, kept by sparkcluster:"
KEPT_ROLES = ("main", "vllm", "router")  # each container's output, and the log of vLLM beside Ray inside vllm_node


def kept_log(role: str) -> str:
    return f"{shell_path(SERVE_STATE_DIR)}/{role}.log"


def _keeper_pid(role: str, host: bool = False) -> str:
    # Not <role>.pid, which the host runtime's stop and alive checks read as its own process. The host runtime's
    # keepers apart: down stops the containers' keepers first, while a host process still writes into its own.
    return f"{shell_path(SERVE_STATE_DIR)}/{role}.{'host-' if host else ''}keeper.pid"


def output_fifo(role: str) -> str:
    """Where the host runtime's `role` process writes its output, for its keeper (removed once both have it open)."""
    return f"{shell_path(SERVE_STATE_DIR)}/{role}.fifo"


def _ours(pid: str, role: str) -> str:
    """Shell that holds when `pid` still is this role's keeper (a pid file outliving a reboot may name another)."""
    return f"ps -ww -o args= -p \"{pid}\" 2>/dev/null | grep -qF 'sparkcluster/serve/{role}.log'"


def stop_keeper(role: str, wait_s: int = 0, host: bool = False) -> str:
    """Shell that stops `role`'s keeper (the host runtime's with `host`), if one runs, after letting it end by itself
    for up to `wait_s` (it does once its source is gone and its last lines are copied), and removes its pid file."""
    pid = "$k"
    wait = (f"i=0; while {_ours(pid, role)} && [ $i -lt {wait_s * 5} ]; do sleep 0.2; i=$((i+1)); done; "
            if wait_s else "")
    return (f"k=$(cat {_keeper_pid(role, host)} 2>/dev/null); if [ -n \"$k\" ]; then {wait}"
            f"if {_ours(pid, role)}; then kill -- -\"$k\" 2>/dev/null; fi; fi; rm -f {_keeper_pid(role, host)}")


def container_output(container: str) -> str:
    """A container's output from its start, streamed until the container is gone."""
    return f"docker logs -f {shlex.quote(container)}"


def file_output(container: str, path: str, pid_file: str) -> str:
    """A log file inside `container` from its first line, streamed until the process writing it ends (or the
    container does). That process writes its pid to `pid_file` as it starts: waited for up to 10 s, past the pid of
    one stopped before it; tail --pid then exits after the last lines the process wrote."""
    inner = (f"i=0; while [ $i -lt 100 ]; do p=$(cat {pid_file} 2>/dev/null); "
             f"[ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null && break; sleep 0.1; i=$((i+1)); done; "
             f"exec tail -n +1 -F --pid=\"${{p:-1}}\" {path}")
    return shlex.join(["docker", "exec", container, "sh", "-c", inner])


def keep_output(source: str, role: str, chunk_bytes: int = KEPT_CHUNK_BYTES) -> str:
    """Shell that starts the keeper of `source`'s output (container_output, file_output) as `role`.log: detached
    (setsid, nohup, no terminal), so that neither the SSH session closing nor the CLI exiting ends it; it ends with
    its source. Any keeper of the role left from before is stopped, and the last serve's kept log replaced."""
    return _keeper(source, role, chunk_bytes)


def keep_host_output(role: str, chunk_bytes: int = KEPT_CHUNK_BYTES) -> str:
    """Shell that makes `role`'s fifo (output_fifo) and starts its keeper reading it, as keep_output does a
    container's. The host runtime's process writes into the fifo and stays the process its pid file names (for stop
    and alive); its keeper, in a session of its own, outlives that process's stop by the last lines it wrote, and
    ends once every writer has (the process and its children). It fails where no fifo could be made: a process
    writing to that path would make a plain file of it, with no bound."""
    fifo = output_fifo(role)
    return _keeper(f"{{ rm -f {fifo}; exec cat; }} < {fifo}", role, chunk_bytes,
                   fifo=f"rm -f {fifo}; mkfifo {fifo} || exit 1")


def _keeper(source: str, role: str, chunk_bytes: int, fifo: str | None = None) -> str:
    log, state = kept_log(role), shell_path(SERVE_STATE_DIR)
    # split runs its filter with $SHELL: the login shell may not be a POSIX one.
    rotate = f"if [ -s {log} ]; then mv -f {log} {log}.1; fi; exec cat > {log}"
    pipeline = (f"{source} 2>&1 | "
                f"SHELL=/bin/sh split -a 12 -b {chunk_bytes} --filter {shlex.quote(rotate)}")
    # Removed, not emptied: a file of the last serve keeps its mode, and may be one made before this was private.
    fresh = f"rm -f {log} {log}.1; : > {log}" + (f"; {fifo}" if fifo else "")
    host = fifo is not None
    return (f"umask 077 && mkdir -p {state} && chmod 700 {state} && {{ {stop_keeper(role, host=host)}; {fresh}; "
            f"setsid nohup sh -c {shlex.quote(pipeline)} > /dev/null 2>&1 < /dev/null & "
            f"echo $! > {_keeper_pid(role, host)}; }}")


def logs_or_kept(container: str, role: str, lines: int, live: str) -> str:
    """Shell: `live` (the last `lines` read from the container) while the container exists; once it is gone, the
    kept log's, after GONE_NOTICE (and not followed: nothing more will come); where neither exists, `live`, which
    says "No such container"."""
    log = kept_log(role)
    return (f"if ! docker inspect {shlex.quote(container)} >/dev/null 2>&1 && [ -e {log} ]; then "
            f"echo {shlex.quote(GONE_NOTICE)}; cat {log}.1 {log} 2>/dev/null | tail -n {lines}; else {live}; fi")
