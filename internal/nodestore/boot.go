package nodestore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cube-dev/cube/internal/atomicfile"
)

// bootIDSuffix names the file (path + suffix) holding the kernel boot id of
// the boot that last opened a store.
const bootIDSuffix = ".boot"

// bootIDPath is where the kernel tells its boot id; a variable for tests.
var bootIDPath = "/proc/sys/kernel/random/boot_id"

// openStore opens the bbolt file at path without per-commit fsync. When the
// file was last opened during another boot (or it is not known when), it
// may have been torn by a power loss: it is opened and checked, and if
// either fails it is renamed to path.broken-<unix time> (kept for
// inspection) and a fresh store is created. Nothing in it could still be
// owned after a reboot. A store locked by another process is an error,
// never moved.
func openStore(path string) (*bolt.DB, error) {
	opts := &bolt.Options{Timeout: 5 * time.Second, NoSync: true}
	boot, _ := os.ReadFile(bootIDPath)
	boot = bytes.TrimSpace(boot)
	prev, _ := os.ReadFile(path + bootIDSuffix)
	sameBoot := len(boot) > 0 && bytes.Equal(bytes.TrimSpace(prev), boot)
	db, err := bolt.Open(path, 0o600, opts)
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("held by another process: %w", err)
	}
	if err == nil && !sameBoot {
		if cerr := check(db); cerr != nil {
			db.Close()
			err = cerr
		}
	}
	if err != nil {
		if sameBoot {
			return nil, err
		}
		aside := path + ".broken-" + strconv.FormatInt(time.Now().Unix(), 10)
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		if db, err = bolt.Open(path, 0o600, opts); err != nil {
			return nil, err
		}
	}
	if !sameBoot && len(boot) > 0 {
		if err := atomicfile.Write(path+bootIDSuffix, append(boot, '\n'), 0o600); err != nil {
			db.Close()
			return nil, fmt.Errorf("record boot id: %w", err)
		}
		// The store itself is synced once per boot, so the file that the
		// boot id vouches for is on disk.
		if err := db.Sync(); err != nil {
			db.Close()
			return nil, err
		}
	}
	return db, nil
}

// check runs bbolt's consistency check over every page.
func check(db *bolt.DB) (err error) {
	defer func() {
		if r := recover(); r != nil { // bbolt panics on some corrupt pages
			err = fmt.Errorf("node store corrupt: %v", r)
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		var errs []error
		for e := range tx.Check() {
			errs = append(errs, e)
		}
		return errors.Join(errs...)
	})
}
