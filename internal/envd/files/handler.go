package files

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/envd/filesystem"
	"github.com/cube-dev/cube/internal/errdefs"
)

// copyChunk is the buffer size used when streaming an upload to disk.
const copyChunk = 32 << 10

// Handler serves GET and POST /files. Authentication is the caller's job.
type Handler struct {
	settings *account.Settings
}

// NewHandler returns a /files handler resolving users through settings.
func NewHandler(settings *account.Settings) *Handler {
	return &Handler{settings: settings}
}

// EntryInfo is one element of the upload response.
type EntryInfo struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// ServeHTTP dispatches on the method.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		h.download(w, r)
	case http.MethodPost:
		h.upload(w, r)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		WriteError(w, http.StatusMethodNotAllowed, "use GET to download or POST to upload")
	}
}

func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	u, err := h.settings.Lookup(q.Get("username"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if q.Get("path") == "" {
		WriteError(w, http.StatusBadRequest, "the path query parameter is required")
		return
	}
	p, err := account.ResolvePath(q.Get("path"), u.Home)
	if err != nil {
		writeErr(w, err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		writeErr(w, osErr(p, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeErr(w, osErr(p, err))
		return
	}
	if fi.IsDir() {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("%s is a directory; list it with ListDir", p))
		return
	}
	if !fi.Mode().IsRegular() {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("%s is not a regular file", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mimeAttachment(filepath.Base(p)))
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	u, err := h.settings.Lookup(q.Get("username"))
	if err != nil {
		writeErr(w, err)
		return
	}
	buf := make([]byte, copyChunk)
	paths, err := readUpload(r, u.Home, q.Get("path"), func(dst string, body io.Reader) error {
		return writeFile(dst, body, u, buf)
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	out := make([]EntryInfo, 0, len(paths))
	for _, p := range paths {
		out = append(out, EntryInfo{Path: p, Name: filepath.Base(p), Type: "file"})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// writeFile streams body into dst (created or truncated), creating parent
// directories; everything it creates belongs to u.
func writeFile(dst string, body io.Reader, u account.User, buf []byte) error {
	if err := filesystem.MkdirAllAs(filepath.Dir(dst), u.UID, u.GID); err != nil {
		return err
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return fmt.Errorf("%s is a directory: %w", dst, errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return osErr(dst, err)
	}
	if err := f.Chown(int(u.UID), int(u.GID)); err != nil && !errors.Is(err, fs.ErrPermission) {
		_ = f.Close()
		return osErr(dst, err)
	}
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, err := f.Write(buf[:n]); err != nil {
				_ = f.Close()
				return osErr(dst, err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			_ = f.Close()
			return fmt.Errorf("upload to %s: %w", dst, rerr)
		}
	}
	if err := f.Close(); err != nil {
		return osErr(dst, err)
	}
	return nil
}

// errNoSpace is answered with 507 Insufficient Storage.
var errNoSpace = errors.New("no space left on device")

func osErr(p string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%s: %w", p, errNoSpace)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: %w", p, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s: %w", p, errdefs.ErrPermissionDenied)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("%s: %v: %w", p, err, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("%s: %w", p, err)
}

func writeErr(w http.ResponseWriter, err error) {
	status := errdefs.HTTPStatus(err)
	switch {
	case errors.Is(err, errNoSpace):
		status = http.StatusInsufficientStorage
	case errors.Is(err, errUnsupportedEncoding):
		status = http.StatusUnsupportedMediaType
	}
	WriteError(w, status, err.Error())
}

// WriteError writes the JSON error body the E2B SDK expects:
// {"code": <status>, "message": "..."}.
func WriteError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Disposition")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

func mimeAttachment(name string) string {
	if v := mime.FormatMediaType("attachment", map[string]string{"filename": name}); v != "" {
		return v
	}
	return "attachment"
}
