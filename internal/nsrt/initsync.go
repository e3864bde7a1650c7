package nsrt

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The shim releases sandbox-init with one message on the sync socket
// (syncFD): a byte saying where the init's cgroup came from, carrying the
// sandbox disk's detached mount (mountDiskDetached) when it has one. EOF
// without a message means the shim gave up. Shim and init are the same
// binary (the init is /proc/self/exe of the shim), so this never crosses
// versions.
const (
	// syncPlaced: the init was born in the sandbox cgroup, and so was
	// every process it started (the user namespace's workload).
	syncPlaced byte = 1
	// syncMoved: the shim moved the init there after it started (a host
	// where forking into the cgroup failed); what the init started before
	// must be moved too.
	syncMoved byte = 2
)

// syncSocket returns a connected pair for the release message: the shim's
// end and the init's.
func syncSocket() (shimEnd, initEnd *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "sync"), os.NewFile(uintptr(fds[1]), "sync"), nil
}

// sendSync releases the init: how (syncPlaced or syncMoved), with disk's
// fd when disk is not nil.
func sendSync(sock *os.File, how byte, disk *os.File) error {
	var oob []byte
	if disk != nil {
		oob = unix.UnixRights(int(disk.Fd()))
	}
	if err := unix.Sendmsg(int(sock.Fd()), []byte{how}, oob, nil, 0); err != nil {
		return fmt.Errorf("release sandbox-init: %w", err)
	}
	return nil
}

// recvSync waits for the shim's release message; disk is the mount it
// carried (nil if none).
func recvSync(sock *os.File) (how byte, disk *os.File, err error) {
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(int(sock.Fd()), b[:], oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, nil, fmt.Errorf("wait for the shim: %w", err)
		}
		if n != 1 {
			return 0, nil, errors.New("shim aborted the start")
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil || len(msgs) != 1 {
				return 0, nil, fmt.Errorf("disk mount from the shim: %d messages: %v", len(msgs), err)
			}
			fds, err := unix.ParseUnixRights(&msgs[0])
			if err != nil || len(fds) != 1 {
				for _, fd := range fds {
					unix.Close(fd)
				}
				return 0, nil, fmt.Errorf("disk mount from the shim: %d fds: %v", len(fds), err)
			}
			disk = os.NewFile(uintptr(fds[0]), "disk-mount")
		}
		if b[0] != syncPlaced && b[0] != syncMoved {
			if disk != nil {
				disk.Close()
			}
			return 0, nil, fmt.Errorf("unknown release message %d from the shim", b[0])
		}
		return b[0], disk, nil
	}
}
