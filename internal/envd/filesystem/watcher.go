package filesystem

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/internal/errdefs"
)

// watchQueue is the number of events a watcher buffers for its reader.
const watchQueue = 64

// networkFS are filesystem magics watched only with allow_network_mounts:
// inotify does not see changes made by other hosts on them.
var networkFS = map[int64]string{
	0x6969:     "nfs",
	0x517b:     "smb",
	0xff534d42: "cifs",
	0xfe534d42: "smb2",
	0x00c36400: "ceph",
	0x5346414f: "afs",
}

// watchSpec is a validated watch request.
type watchSpec struct {
	root         string
	recursive    bool
	includeEntry bool
	allowNetwork bool
}

// watcher turns inotify events under a directory into FilesystemEvents.
type watcher struct {
	spec   watchSpec
	names  *names
	fsw    *fsnotify.Watcher
	events chan *pb.FilesystemEvent // closed when the watcher stops
	stop   chan struct{}
	done   chan struct{}
}

func newWatcher(spec watchSpec, n *names) (*watcher, error) {
	fi, err := os.Stat(spec.root)
	if err != nil {
		return nil, fsError(spec.root, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory: %w", spec.root, errdefs.ErrInvalidArgument)
	}
	if !spec.allowNetwork {
		var st unix.Statfs_t
		if err := unix.Statfs(spec.root, &st); err == nil {
			if name, ok := networkFS[int64(st.Type)]; ok {
				return nil, fmt.Errorf("%s is on a network filesystem (%s); set allowNetworkMounts to watch it anyway: %w",
					spec.root, name, errdefs.ErrFailedPrecondition)
			}
		}
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("create inotify watcher: %w", errdefs.ErrResourceExhausted)
	}
	w := &watcher{spec: spec, names: n, fsw: fsw, events: make(chan *pb.FilesystemEvent, watchQueue),
		stop: make(chan struct{}), done: make(chan struct{})}
	if err := w.add(spec.root, true); err != nil {
		_ = fsw.Close()
		return nil, err
	}
	go w.loop()
	return w, nil
}

// add watches dir and, when recursive, every directory below it. Only an
// error on the root itself is returned.
func (w *watcher) add(dir string, isRoot bool) error {
	if err := w.fsw.Add(dir); err != nil {
		if isRoot {
			return fsError(dir, err)
		}
		return nil
	}
	if !w.spec.recursive {
		return nil
	}
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		if de.IsDir() {
			_ = w.add(filepath.Join(dir, de.Name()), false)
		}
	}
	return nil
}

func (w *watcher) loop() {
	defer close(w.done)
	defer close(w.events)
	for {
		select {
		case <-w.stop:
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if w.spec.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					_ = w.add(ev.Name, false)
				}
			}
			for _, fe := range w.convert(ev) {
				select {
				case w.events <- fe:
				case <-w.stop:
					return
				}
			}
		case _, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			// Overflow or a vanished watch: nothing a client could act on.
		}
	}
}

var opTypes = []struct {
	op fsnotify.Op
	t  pb.EventType
}{
	{fsnotify.Create, pb.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Write, pb.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, pb.EventType_EVENT_TYPE_REMOVE},
	{fsnotify.Rename, pb.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, pb.EventType_EVENT_TYPE_CHMOD},
}

func (w *watcher) convert(ev fsnotify.Event) []*pb.FilesystemEvent {
	name, err := filepath.Rel(w.spec.root, ev.Name)
	if err != nil {
		name = ev.Name
	}
	var out []*pb.FilesystemEvent
	for _, ot := range opTypes {
		if !ev.Has(ot.op) {
			continue
		}
		fe := &pb.FilesystemEvent{Name: name, Type: ot.t}
		if w.spec.includeEntry && ot.t != pb.EventType_EVENT_TYPE_REMOVE && ot.t != pb.EventType_EVENT_TYPE_RENAME {
			if e, err := w.names.entry(ev.Name); err == nil {
				fe.Entry = e
			}
		}
		out = append(out, fe)
	}
	return out
}

// close stops the watcher and releases its inotify instance.
func (w *watcher) close() error {
	select {
	case <-w.stop:
		return nil
	default:
	}
	close(w.stop)
	err := w.fsw.Close()
	<-w.done
	if err != nil && !errors.Is(err, fs.ErrClosed) {
		return fmt.Errorf("close watcher: %w", err)
	}
	return nil
}
