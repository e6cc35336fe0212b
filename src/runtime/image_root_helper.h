#pragma once
// sbx-rootfs: the step between the runtime's spawn and bubblewrap for a sandbox of an OCI
// image. bubblewrap 0.8 cannot mount an overlay, so this helper gives the sandbox its
// copy-on-write root and then becomes bubblewrap (exec: same pid, so the sandbox's top
// process and its state file are what they are for a host-root sandbox):
//
//   sbx-rootfs --lower IMAGE_ROOTFS --dir HOST_FOLDER [--idmap UID:GID] [--layer_bytes N]
//              [--snapshot SNAPSHOT_FOLDER --workspace_bytes N]
//              [--reset_target PATH]... [--strict_target PATH]... -- BWRAP ARGS...
//
// In HOST_FOLDER (the sandbox's, 0700, never seen by the sandbox) it makes `lower` (the
// image's rootfs mounted read-only, nosuid, nodev), `upper` and `work` (the sandbox's own
// layer) and `root`, where the overlay of the two is mounted; the mounts live in a mount
// namespace of the sandbox's own and end with it (nothing to unmount, nothing left on
// the host's mount table, a server restart changes nothing).
// With --snapshot (a sandbox that starts at a snapshot: a fork, a reset, a member of a
// snapshot's pool), the snapshot's `root` is mounted read-only (`snap`) as a layer between
// the image and the sandbox's own, and its `workspace` read-only (`snapws`) under an
// overlay at `ws` whose upper layer is a tmpfs of --workspace_bytes (`wslayer`), which
// bubblewrap binds as the sandbox's workspace: the snapshot's files are shared by every
// sandbox of it, never copied, and each sandbox writes only its own layers.
// - Run as root (--idmap UID:GID, the sandbox's host uid and gid): a new mount namespace;
//   the image, owned by root in the cache, is mounted idmapped so that its files belong
//   to UID:GID; the overlay is the kernel's, mounted by root; then the helper becomes
//   UID:GID (no groups) before it runs bubblewrap.
// - Run unprivileged (no --idmap): a new user namespace mapping only the helper's uid and
//   gid to 0 (the image belongs to that uid in the cache), a mount namespace in it, and
//   the overlay with `userxattr`.
// Either way every file of the image belongs to the sandbox's user inside it, and nothing
// in it is any host privilege. bubblewrap binds the overlay by its path,
// `--bind HOST_FOLDER/root /` (its --bind-fd resolves a descriptor's path in its own mount
// namespace, where this one's mount is not); every descriptor passes through untouched.
//
// The image is hostile: before bubblewrap mounts anything, each --reset_target (a path
// the runtime itself mounts over: /dev, /proc, /tmp, /run) loses any symbolic link or
// non-folder on its way in the sandbox's layer (so no mount follows the image's link out
// of the root), and a --strict_target (a template mount's target, the working folder)
// with a symbolic link on its way refuses the start, naming it.
//
// Errors go to stderr (the sandbox's output, which the runtime shows when a start fails)
// and exit 125.

namespace sbx::runtime {

int ImageRootHelperMain(int argc, char** argv);

}  // namespace sbx::runtime
