#!/bin/sh
# Boots one simulated DGX Spark. Started by sparkcluster.sim inside the host's own network namespace as
#   ip netns exec NS unshare --mount --uts --ipc --pid --fork --kill-child --propagation private -- sh boot.sh
# so everything below lands in fresh mount/UTS/IPC/PID namespaces. Inputs come from the environment:
#   SIM_LAB (cluster dir), SIM_HOST_DIR (this host's state dir), SIM_HOSTNAME, SIM_USER, SIM_UID,
#   SIM_DOCKER (1 = start dockerd), SIM_DOCKER_RUNTIME (path of a runc wrapper, or empty),
#   SIM_STORAGE_DRIVER, SIM_CGROUP_PARENT.
# It ends as the host's PID 1: a real OpenSSH sshd. SIGTERM to it powers the host off (the kernel then kills
# every process of the PID namespace).
set -eu
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
H=$SIM_HOST_DIR
R=$H/root
mkdir -p "$H/upper" "$H/work" "$R" "$H/docker-data"

# Copy-on-write "/": writes land in $H/upper, so each host has its own disk and tests can read it from outside.
mount -t overlay "sim-$SIM_HOSTNAME" -o "lowerdir=/,upperdir=$H/upper,workdir=$H/work" "$R"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o size=2g,mode=1777 shm "$R/dev/shm"   # own /dev/shm: Ray's plasma store lives there
mount -t proc proc "$R/proc"                            # this PID namespace only
mount --rbind /sys "$R/sys"

# `ip netns exec` remounted /sys without the cgroup submounts, and dockerd needs them.
if grep -q '^0::' /proc/self/cgroup && [ "$(wc -l < /proc/self/cgroup)" = 1 ]; then
  mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup"
else
  mount -t tmpfs -o mode=755 cgroup "$R/sys/fs/cgroup"
  for ctl in $(cut -d: -f2 /proc/self/cgroup); do
    d=${ctl#name=}
    mkdir -p "$R/sys/fs/cgroup/$d"
    case $ctl in name=*) opts=none,$ctl ;; *) opts=$ctl ;; esac
    mount -t cgroup -o "$opts" cgroup "$R/sys/fs/cgroup/$d"
  done
fi

# /sys/class/infiniband cannot be created in sysfs: put a tmpfs over /sys/class, re-bind every real class
# into it and add the emulated RDMA devices (rendered by sparkcluster.sim.hardware).
mount -t tmpfs -o mode=755 sysclass "$R/sys/class"
for d in /sys/class/*; do
  mkdir "$R/sys/class/${d##*/}"
  mount --rbind "$d" "$R/sys/class/${d##*/}"
done
mkdir "$R/sys/class/infiniband"
mount --bind "$H/sys-infiniband" "$R/sys/class/infiniband"
mount -o remount,bind,ro "$R/sys/class/infiniband"   # read-only, like sysfs
# The BIOS a Spark reports (/sys/class/dmi/id), and /proc/meminfo with the CMA pool a host was given.
mkdir -p "$R/sys/class/dmi"
mount --bind "$H/sys-dmi" "$R/sys/class/dmi"
[ -f "$H/meminfo" ] && mount --bind "$H/meminfo" "$R/proc/meminfo"

mount -t tmpfs -o mode=755 run "$R/run"
mkdir -p "$R/run/sshd"
# The emulated kernel's own writable view of the RDMA tree: sim-gid-cache updates the GIDs through it.
mkdir -m 700 "$R/run/sim-infiniband"
mount --bind "$H/sys-infiniband" "$R/run/sim-infiniband"
# Docker's overlay2 cannot stack on the host's overlay: give it a directory of the real filesystem.
mkdir -p "$R/var/lib/docker"
mount --bind "$H/docker-data" "$R/var/lib/docker"

hostname "$SIM_HOSTNAME"
# pivot_root, not chroot: under chroot, setns-based tools (runc exec, nsenter) land in the real machine's root.
cd "$R"
pivot_root . .
umount -l .
cd /

echo "$SIM_HOSTNAME" > /etc/hostname
cat "$SIM_LAB/etc-hosts" > /etc/hosts
chmod 711 /root   # a login user must reach interpreters installed under /root (pyenv); copy-up only

# First boot after a fresh disk only: a reboot keeps what provisioning changed (keys, groups, sudoers).
FIRST_BOOT_DONE=/var/lib/sparkcluster-sim/first-boot-done
if [ ! -e "$FIRST_BOOT_DONE" ]; then
  id "$SIM_USER" >/dev/null 2>&1 || useradd -m -u "$SIM_UID" -s /bin/bash "$SIM_USER"
  usermod -p '*' "$SIM_USER"   # with UsePAM no, a locked password ('!') makes sshd refuse the key
  printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$SIM_USER" > "/etc/sudoers.d/$SIM_USER"
  chmod 440 "/etc/sudoers.d/$SIM_USER"
  for account in root "$SIM_USER"; do
    home=$(getent passwd "$account" | cut -d: -f6)
    install -d -m 700 -o "$account" -g "$account" "$home/.ssh"
    install -m 600 -o "$account" -g "$account" "$SIM_LAB/client_ed25519.pub" "$home/.ssh/authorized_keys"
    if [ -f "$SIM_LAB/mesh_ed25519" ]; then   # NVIDIA's "connect two Sparks" leaves passwordless ssh between nodes
      install -m 600 -o "$account" -g "$account" "$SIM_LAB/mesh_ed25519" "$home/.ssh/id_ed25519"
      install -m 644 -o "$account" -g "$account" "$SIM_LAB/mesh_ed25519.pub" "$home/.ssh/id_ed25519.pub"
      cat "$SIM_LAB/mesh_ed25519.pub" >> "$home/.ssh/authorized_keys"
      install -m 644 -o "$account" -g "$account" "$SIM_LAB/known_hosts" "$home/.ssh/known_hosts"
    fi
  done
  mkdir -p "${FIRST_BOOT_DONE%/*}"
  touch "$FIRST_BOOT_DONE"
fi

# The kernel adds and drops the IPv4-mapped RoCE GIDs as addresses come and go: so does the emulation.
setsid /usr/local/bin/sim-gid-cache < /dev/null > /var/log/sim-gid-cache.log 2>&1 &

if [ "$SIM_DOCKER" = 1 ]; then
  # Like the system service of a real Spark. No iptables, no bridge: the host's netns stays as sim made it.
  set -- --data-root /var/lib/docker --exec-root /run/docker --pidfile /run/docker.pid \
    -H unix:///run/docker.sock --group docker \
    --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
    --storage-driver "$SIM_STORAGE_DRIVER" \
    --exec-opt native.cgroupdriver=cgroupfs --cgroup-parent "$SIM_CGROUP_PARENT"
  if [ -n "$SIM_DOCKER_RUNTIME" ]; then
    set -- "$@" --add-runtime "simrunc=$SIM_DOCKER_RUNTIME" --default-runtime simrunc
  fi
  setsid dockerd "$@" > /var/log/dockerd.log 2>&1 < /dev/null &
  tries=0
  until docker -H unix:///run/docker.sock version >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -gt 150 ] || ! kill -0 $! 2>/dev/null; then
      echo "sim boot: dockerd did not come up; last lines of /var/log/dockerd.log:" >&2
      tail -n 20 /var/log/dockerd.log >&2
      exit 1
    fi
    sleep 0.1
  done
fi

# systemd's part of a boot: every unit enabled in multi-user.target starts (the emulated systemctl runs it; /run is
# this boot's tmpfs, so nothing of an earlier boot's units is left). No enabled unit: no python start at all.
if [ -n "$(ls -A /etc/systemd/system/multi-user.target.wants 2>/dev/null)" ]; then
  /usr/local/bin/systemctl __boot > /var/log/sim-systemd-boot.log 2>&1 \
    || echo "sim boot: starting the enabled units failed; see /var/log/sim-systemd-boot.log" >&2
fi

exec /usr/sbin/sshd -D -e -f "$SIM_LAB/sshd_config" -h /etc/ssh/ssh_host_ed25519_key
