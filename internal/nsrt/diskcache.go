package nsrt

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// DiskCache makes sandbox disk images by copying a formatted image of the
// same size instead of running mkfs.ext4 for every sandbox. mkfs forks a
// tool and fsyncs the image four times (p50 ~6 ms, p90 10-100 ms on a busy
// disk, measured on the project's VM); the copy moves the ~600 KB of
// metadata a fresh filesystem has through the page cache (copy_file_range
// over the image's data extents) in well under a millisecond. The copy is
// not synced: like the filesystem on it (no journal) it only lives as long
// as the sandbox, and no sandbox survives a power loss.
//
// Each copy gets its own filesystem UUID and directory-hash seed, as mkfs
// would have given it: the formatted image carries metadata_csum_seed, so
// the metadata checksums do not depend on the UUID, and only the
// superblock's checksum is recomputed (verified against the stored one
// first; an image whose checksum this code cannot reproduce is copied
// unchanged).
//
// The formatted images live in Dir, one per size, made once (by mkfs, fsynced,
// then renamed into place) and kept: a state dir left by an older version
// has none and gets them on first use.
type DiskCache struct {
	dir string

	mu    sync.Mutex
	sizes map[int]*sync.Mutex // serialises the first formatting per size
}

// diskCacheVersion names the mkfs options of the cached images: change it
// with them, so images made with the old ones are not used.
const diskCacheVersion = "v1"

// NewDiskCache keeps its formatted images in dir (created on first use).
func NewDiskCache(dir string) *DiskCache {
	return &DiskCache{dir: dir, sizes: map[int]*sync.Mutex{}}
}

// Make creates a formatted disk image of sizeMB at img, replacing any file
// there, like MakeDisk (which a nil cache runs).
func (d *DiskCache) Make(img string, sizeMB int) error {
	if d == nil {
		return MakeDisk(img, sizeMB)
	}
	golden, err := d.golden(sizeMB)
	if err != nil {
		return err
	}
	err = copySparse(img, golden, int64(sizeMB)<<20)
	if errors.Is(err, errNotSparse) {
		return MakeDisk(img, sizeMB) // a filesystem without SEEK_DATA
	}
	if err != nil {
		os.Remove(img)
		return fmt.Errorf("copy formatted disk image: %w", err)
	}
	return nil
}

// errNotSparse: the formatted image reads as one big data extent (its
// filesystem does not report holes); copying it would write the whole size.
var errNotSparse = errors.New("formatted disk image is not sparse here")

// maxExtent is far more than any extent of a fresh ext4 (~600 KB of data
// in 8 extents for 1 GiB).
const maxExtent = 64 << 20

// golden returns the path of the formatted image of sizeMB, formatting it
// first if it does not exist yet.
func (d *DiskCache) golden(sizeMB int) (string, error) {
	path := filepath.Join(d.dir, "ext4-"+strconv.Itoa(sizeMB)+"M-"+diskCacheVersion+".img")
	if fi, err := os.Stat(path); err == nil && fi.Size() == int64(sizeMB)<<20 {
		return path, nil
	}
	d.mu.Lock()
	mu := d.sizes[sizeMB]
	if mu == nil {
		mu = &sync.Mutex{}
		d.sizes[sizeMB] = mu
	}
	d.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if fi, err := os.Stat(path); err == nil && fi.Size() == int64(sizeMB)<<20 {
		return path, nil // another create made it meanwhile
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return "", fmt.Errorf("disk image cache: %w", err)
	}
	tmp := path + ".tmp"
	// mkfs.ext4 fsyncs the image before it exits: the rename publishes a
	// complete file.
	if err := makeDisk(tmp, sizeMB, "metadata_csum_seed"); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("disk image cache: %w", err)
	}
	return path, nil
}

// copySparse copies src's data extents to a new file dst of size bytes
// (holes stay holes), then gives the copy a fresh UUID.
func copySparse(dst, src string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = copyExtents(out, in, size)
	if err == nil {
		err = out.Truncate(size)
	}
	if err == nil {
		err = renewExt4IDs(out)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyExtents copies every data extent of in (SEEK_DATA/SEEK_HOLE) to the
// same offsets of out.
func copyExtents(out, in *os.File, size int64) error {
	for off := int64(0); off < size; {
		start, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data after off
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		end, err := unix.Seek(int(in.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		if end-start > maxExtent {
			return errNotSparse
		}
		if err := copyRange(out, in, start, end-start); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// copyRange copies n bytes at off from in to out, in the kernel when it can.
func copyRange(out, in *os.File, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(n), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				_, err = io.Copy(io.NewOffsetWriter(out, woff), io.NewSectionReader(in, roff, n))
				return err
			}
			return fmt.Errorf("copy_file_range: %w", err)
		}
		if c == 0 {
			return fmt.Errorf("copy_file_range: short copy at %d: %w", roff, io.ErrUnexpectedEOF)
		}
		n -= int64(c)
	}
	return nil
}

// ext4 superblock layout (offsets within the 1024-byte superblock, which
// starts at byte 1024 of the filesystem).
const (
	sbOffset          = 1024
	sbSize            = 1024
	sbMagic           = 0x38 // le16 0xEF53
	sbFeatureIncompat = 0x60
	sbFeatureROCompat = 0x64
	sbUUID            = 0x68 // 16 bytes
	sbHashSeed        = 0xEC // 16 bytes
	sbChecksum        = 0x3FC

	ext4Magic            = 0xEF53
	roCompatMetadataCsum = 0x400
	incompatCsumSeed     = 0x2000
)

// ext4SBChecksum is the kernel's ext4_superblock_csum: crc32c seeded with
// ~0 and not inverted at the end. The table is made on first use (crc32
// keeps it): a package-level one cost every start of cube-shim, which
// never checks a superblock, ~0.15 ms.
func ext4SBChecksum(sb []byte) uint32 {
	return ^crc32.Update(0, crc32.MakeTable(crc32.Castagnoli), sb[:sbChecksum])
}

// renewExt4IDs gives the ext4 filesystem in f a new random UUID and
// directory-hash seed, when its metadata checksums do not depend on the
// UUID (metadata_csum_seed) and its superblock checksum is one this code
// reproduces. Otherwise f is left as it is (a valid filesystem, with the
// formatted image's ids).
func renewExt4IDs(f *os.File) error {
	sb := make([]byte, sbSize)
	if _, err := f.ReadAt(sb, sbOffset); err != nil {
		return fmt.Errorf("read superblock: %w", err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[sbMagic:]) != ext4Magic {
		return fmt.Errorf("disk image is not ext4")
	}
	csum := le.Uint32(sb[sbFeatureROCompat:])&roCompatMetadataCsum != 0
	if csum && (le.Uint32(sb[sbFeatureIncompat:])&incompatCsumSeed == 0 || ext4SBChecksum(sb) != le.Uint32(sb[sbChecksum:])) {
		return nil
	}
	if _, err := rand.Read(sb[sbUUID : sbUUID+16]); err != nil {
		return err
	}
	sb[sbUUID+6] = sb[sbUUID+6]&0x0f | 0x40 // version 4
	sb[sbUUID+8] = sb[sbUUID+8]&0x3f | 0x80 // RFC 4122 variant
	if _, err := rand.Read(sb[sbHashSeed : sbHashSeed+16]); err != nil {
		return err
	}
	if csum {
		le.PutUint32(sb[sbChecksum:], ext4SBChecksum(sb))
	}
	if _, err := f.WriteAt(sb, sbOffset); err != nil {
		return fmt.Errorf("write superblock: %w", err)
	}
	return nil
}
