package cubelet

import (
	"context"
	"io/fs"
	"path/filepath"

	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
)

// diskUsage reports a sandbox's writable-layer usage and size: from the
// sandbox's own filesystem when it has a size-limited disk, else by summing
// the overlay upper dir against the template's disk size.
func (c *Cubelet) diskUsage(ctx context.Context, rec nodestore.Sandbox) (used, total int64) {
	if c.diskSizeMB(rec) > 0 {
		if sb, err := nsrt.Attach(ctx, c.sandboxDir(rec.Runtime())); err == nil {
			defer sb.Close()
			if used, total, err := nsrt.DiskUsage(sb.InitPID()); err == nil {
				return used, total
			}
		}
	}
	filepath.WalkDir(filepath.Join(c.sandboxDir(rec.Runtime()), "upper"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			used += info.Size()
		}
		return nil
	})
	return used, int64(rec.DiskSizeMB) << 20
}
