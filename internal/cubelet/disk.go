package cubelet

import (
	"io/fs"
	"path/filepath"
)

// diskUsage sums the bytes in a sandbox's writable layer (the overlay upper
// dir in its state dir) and reports the template's disk size as the total.
func diskUsage(stateDir string, diskSizeMB int) (used, total int64) {
	filepath.WalkDir(filepath.Join(stateDir, "upper"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			used += info.Size()
		}
		return nil
	})
	return used, int64(diskSizeMB) << 20
}
