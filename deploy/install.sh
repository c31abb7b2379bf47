#!/bin/sh
# Installs ebpf-portmap on a Kubernetes node: copies the plugin binary into
# the node's CNI plugin directory and chains it into the CNI configuration
# the runtime uses, in place of the upstream portmap plugin. It runs in the
# DaemonSet of daemonset.yaml with the node's directories mounted under
# $HOST_ROOT; on a node itself, run it with HOST_ROOT=/.
#
# The configuration is edited by `ebpf-portmap chain` (the binary itself:
# JSON edited with serde, the result checked by the plugin's own parser,
# atomic writes, a backup of the original); this script copies the binary,
# loops, and keeps the order right: the binary is in place before any
# configuration names it, and removed only after none does.
#
# Usage: install.sh [ACTION]     (default: $EPM_ACTION, else install)
#   install    copy the binary (atomically, only if it differs), chain it; exit
#   watch      install, then again every $EPM_INTERVAL seconds, for ever: waits
#              for the main plugin to write its configuration, chains it again
#              when the main plugin rewrites it, restores a removed binary.
#              Prints only what changed. The DaemonSet's mode.
#   uninstall  restore the configurations from their backups, then remove the
#              binary, unless the dataplane is still pinned under
#              $EPM_PIN_ROOT (exit 3: run `ebpf-portmap uninstall` on the node
#              first, then this again)
#   cleanup    uninstall every $EPM_INTERVAL seconds until done, then idle
#              (the DaemonSet's removal mode: the agent, in the same mode,
#              removes each remaining pod's mappings once its network
#              namespace is gone and then the dataplane; no one steps in)
#   ready      exit 0 if the node is as $EPM_ACTION leaves it (readiness probe;
#              see ready() for what that means)
#
# Environment [default]:
#   HOST_ROOT        where the node's root (or its CNI directories) is mounted [/host]
#   CNI_BIN_DIR      the node's CNI plugin directory [/opt/cni/bin]
#   CNI_NET_DIR      the node's CNI configuration directory [/etc/cni/net.d]
#   EPM_BINARY       the ebpf-portmap binary to install [/usr/local/bin/ebpf-portmap]
#   EPM_PLUGIN_CONF  keys for the chained entry, a JSON object [none]
#   EPM_CNI_NETWORK  chain the network of this name (for a runtime that picks
#                    its network by name) instead of the lexically first
#                    configuration [none]
#   EPM_FORCE_CRIO   1: chain even on a node CRI-O runs, where the plugin is
#                    never asked to map a port (CRI-O maps host ports itself
#                    and passes none to CNI) [unset: refuse, change nothing]
#   EPM_PIN_ROOT     the plugin's pinRoot on the node [/sys/fs/bpf/ebpf-portmap]
#   EPM_INTERVAL     seconds between two rounds of watch and cleanup [5]
#
# Exit status: 0 done, 1 failed (nothing half-done), 2 usage, 3 see uninstall.

set -u

HOST_ROOT=${HOST_ROOT:-/host}
CNI_BIN_DIR=${CNI_BIN_DIR:-/opt/cni/bin}
CNI_NET_DIR=${CNI_NET_DIR:-/etc/cni/net.d}
EPM_BINARY=${EPM_BINARY:-/usr/local/bin/ebpf-portmap}
EPM_PLUGIN_CONF=${EPM_PLUGIN_CONF:-}
EPM_CNI_NETWORK=${EPM_CNI_NETWORK:-}
EPM_FORCE_CRIO=${EPM_FORCE_CRIO:-}
EPM_PIN_ROOT=${EPM_PIN_ROOT:-/sys/fs/bpf/ebpf-portmap}
EPM_INTERVAL=${EPM_INTERVAL:-5}
EPM_ACTION=${EPM_ACTION:-install}

# HOST_ROOT=/ must not give "//opt/cni/bin".
root=${HOST_ROOT%/}
bin_dir=$root$CNI_BIN_DIR
net_dir=$root$CNI_NET_DIR
pin_root=$root$EPM_PIN_ROOT
plugin=$bin_dir/ebpf-portmap

say() {
    printf 'install.sh: %s\n' "$*"
}

fail() {
    say "$*" >&2
    return 1
}

# `ebpf-portmap chain ACTION` on the node's configuration directory (the
# network named EPM_CNI_NETWORK in it, if set).
chain() {
    chain_action=$1
    set -- "$chain_action" --net-dir "$net_dir"
    if [ -n "$EPM_CNI_NETWORK" ]; then
        set -- "$@" --network "$EPM_CNI_NETWORK"
    fi
    if [ -n "$EPM_PLUGIN_CONF" ] && [ "$chain_action" != remove ]; then
        set -- "$@" --entry "$EPM_PLUGIN_CONF"
    fi
    # CRI-O's configuration and socket are looked for under the node's root
    # (seen only where they are mounted); there the install is refused.
    if [ "$chain_action" = install ]; then
        set -- "$@" --host-root "${root:-/}"
        if [ "$EPM_FORCE_CRIO" = 1 ]; then
            set -- "$@" --force
        fi
    fi
    "$EPM_BINARY" chain "$@"
}

check_dirs() {
    [ -x "$EPM_BINARY" ] || fail "$EPM_BINARY: no such executable (set EPM_BINARY)" || return 1
    for dir in "$bin_dir" "$net_dir"; do
        # Never create them: a missing one means a missing mount, and files
        # written into the container would be lost silently.
        [ -d "$dir" ] || fail "$dir: no such directory (is the node's ${dir#"$root"} mounted there? HOST_ROOT=$HOST_ROOT)" || return 1
    done
}

# Copies the binary unless the node has the same one (then it says
# nothing): a temp file in the same directory renamed over the old, so the
# runtime never runs half a file.
install_binary() {
    if [ -f "$plugin" ] && cmp -s "$EPM_BINARY" "$plugin"; then
        return 0
    fi
    temp=$bin_dir/.ebpf-portmap.$$.tmp
    if cp "$EPM_BINARY" "$temp" && chmod 0755 "$temp" && mv -f "$temp" "$plugin"; then
        say "$plugin: installed"
    else
        rm -f "$temp"
        fail "$plugin: cannot install"
    fi
}

install_once() {
    check_dirs || return 1
    # The binary first: a configuration naming a missing plugin fails every pod.
    install_binary || return 1
    chain install
}

# Exit 0 once done, 3 while the dataplane is still pinned.
uninstall_once() {
    check_dirs || return 1
    # The configurations first: the binary goes only once none names it
    # (`chain remove` fails if the one the runtime uses still does).
    chain remove || return 1
    if [ -d "$pin_root" ] && [ -n "$(ls -A "$pin_root" 2>/dev/null)" ] && [ "$action" = cleanup ]; then
        say "$plugin: kept while the dataplane is still pinned under $EPM_PIN_ROOT:" \
            "the agent (EPM_ACTION=cleanup) removes each pod's mappings once its network namespace is gone," \
            "then the dataplane; 'ebpf-portmap list' on the node shows what is left"
        return 3
    fi
    if [ -d "$pin_root" ] && [ -n "$(ls -A "$pin_root" 2>/dev/null)" ]; then
        say "$plugin: kept while the dataplane is still pinned under $EPM_PIN_ROOT:" \
            "pods started while ebpf-portmap was chained publish their ports through it" \
            "until they are recreated. Recreate them, then run 'ebpf-portmap uninstall' on the node" \
            "('ebpf-portmap list' shows what is left; the runtime no longer removes it," \
            "so add --force once none of it belongs to a running pod); then uninstall again"
        return 3
    fi
    if [ -e "$plugin" ]; then
        rm -f "$plugin" || fail "$plugin: cannot remove" || return 1
        say "$plugin: removed"
    else
        say "$plugin: not installed"
    fi
}

sleeper=
# PID 1 in a container ignores SIGTERM unless it sets a handler.
trap '[ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null; exit 0' TERM INT

pause() {
    sleep "$1" &
    sleeper=$!
    wait "$sleeper"
    sleeper=
}

newline='
'

# Runs a round every EPM_INTERVAL seconds and prints the lines of its output
# that the last round did not print, so a node that stays as it is logs
# nothing. Returns once an uninstall round succeeds.
every_interval() {
    last=
    while :; do
        output=$("$@" 2>&1)
        status=$?
        printf '%s\n' "$output" | while IFS= read -r line; do
            case "$newline$last$newline" in
            *"$newline$line$newline"*) ;;
            *) printf '%s\n' "$line" ;;
            esac
        done
        last=$output
        [ "$1" = uninstall_once ] && [ "$status" -eq 0 ] && return 0
        pause "$EPM_INTERVAL"
    done
}

# watch, install: the binary is the image's and the configuration the
# runtime uses is chained as asked. cleanup, uninstall: no configuration is
# chained by this installer any more (its backups are gone); the binary may
# still wait for the dataplane's removal, which must not hold up a rollout.
ready() {
    case $EPM_ACTION in
    uninstall | cleanup)
        for backup in "$net_dir"/*.ebpf-portmap.bak "$net_dir"/.*.ebpf-portmap.bak; do
            [ -e "$backup" ] && return 1
        done
        return 0
        ;;
    *)
        [ -x "$plugin" ] && cmp -s "$EPM_BINARY" "$plugin" && chain check
        ;;
    esac
}

action=${1:-$EPM_ACTION}
case $action in
install)
    install_once
    ;;
watch)
    every_interval install_once
    ;;
uninstall)
    uninstall_once
    ;;
cleanup)
    every_interval uninstall_once
    say "uninstalled; idle until this DaemonSet is deleted"
    while :; do pause 3600; done
    ;;
ready)
    ready
    ;;
*)
    say "unknown action '$action'; use install, watch, uninstall, cleanup or ready" >&2
    exit 2
    ;;
esac
