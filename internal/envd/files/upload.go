package files

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"

	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/errdefs"
)

// maxFileParts bounds the number of files in one multipart upload.
const maxFileParts = 10_000

// sink stores one uploaded file at an absolute path.
type sink func(path string, body io.Reader) error

// errClient marks errors caused by the request body (bad encoding, cut
// connection); the handler answers them with 400.
var errClient = errdefs.ErrInvalidArgument

// readUpload parses an upload request and hands every file to store, in
// order, without buffering file contents. home resolves relative paths and
// pathQuery is the request's path parameter ("" when absent). It returns the
// absolute paths written.
func readUpload(r *http.Request, home, pathQuery string, store sink) ([]string, error) {
	body, err := decodeBody(r)
	if err != nil {
		return nil, err
	}
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil && r.Header.Get("Content-Type") != "" {
		return nil, fmt.Errorf("bad Content-Type: %w", errdefs.ErrInvalidArgument)
	}
	switch mediaType {
	case "multipart/form-data":
		boundary := params["boundary"]
		if boundary == "" {
			return nil, fmt.Errorf("multipart Content-Type without boundary: %w", errdefs.ErrInvalidArgument)
		}
		return readMultipart(multipart.NewReader(body, boundary), home, pathQuery, store)
	case "application/octet-stream", "":
		if pathQuery == "" {
			return nil, fmt.Errorf("raw uploads need the path query parameter: %w", errdefs.ErrInvalidArgument)
		}
		dst, err := account.ResolvePath(pathQuery, home)
		if err != nil {
			return nil, err
		}
		if err := store(dst, body); err != nil {
			return nil, err
		}
		return []string{dst}, nil
	default:
		return nil, fmt.Errorf("unsupported Content-Type %q; use multipart/form-data or application/octet-stream: %w",
			mediaType, errdefs.ErrInvalidArgument)
	}
}

// clientReader marks read errors of the request body as client errors.
type clientReader struct{ r io.Reader }

func (c clientReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("read upload body: %v: %w", err, errClient)
	}
	return n, err
}

func decodeBody(r *http.Request) (io.Reader, error) {
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return clientReader{r.Body}, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(clientReader{r.Body})
		if err != nil {
			return nil, fmt.Errorf("bad gzip body: %w", errClient)
		}
		return clientReader{zr}, nil
	default:
		return nil, fmt.Errorf("unsupported Content-Encoding %q: %w", enc, errUnsupportedEncoding)
	}
}

var errUnsupportedEncoding = errors.New("unsupported encoding")

func readMultipart(mr *multipart.Reader, home, pathQuery string, store sink) ([]string, error) {
	var written []string
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return written, fmt.Errorf("read multipart body: %w", errClient)
		}
		if part.FormName() != "file" {
			_ = part.Close()
			continue
		}
		target := pathQuery
		if target == "" {
			target = rawFilename(part)
		}
		if target == "" {
			return written, fmt.Errorf("file part without a filename (the target path): %w", errdefs.ErrInvalidArgument)
		}
		dst, err := account.ResolvePath(target, home)
		if err != nil {
			return written, err
		}
		if seen[dst] {
			return written, fmt.Errorf("several files target %s; use one part per path (and no path query for several files): %w",
				dst, errdefs.ErrInvalidArgument)
		}
		if len(seen) >= maxFileParts {
			return written, fmt.Errorf("more than %d files in one upload: %w", maxFileParts, errdefs.ErrInvalidArgument)
		}
		seen[dst] = true
		if err := store(dst, clientReader{part}); err != nil {
			return written, err
		}
		written = append(written, dst)
		_ = part.Close()
	}
	if len(written) == 0 {
		return nil, fmt.Errorf("no part named \"file\" in the multipart body: %w", errdefs.ErrInvalidArgument)
	}
	return written, nil
}

// rawFilename returns the filename parameter of a part's
// Content-Disposition unchanged (multipart.Part.FileName keeps only the
// base name, but E2B sends the full target path there).
func rawFilename(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}
