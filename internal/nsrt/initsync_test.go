package nsrt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSyncMessage(t *testing.T) {
	t.Run("with a file", func(t *testing.T) {
		shimEnd, initEnd := testSyncSocket(t)
		f, err := os.Create(filepath.Join(t.TempDir(), "mount"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := sendSync(shimEnd, syncPlaced, f); err != nil {
			t.Fatal(err)
		}
		how, got, err := recvSync(initEnd)
		if err != nil || how != syncPlaced || got == nil {
			t.Fatalf("recvSync = %d, %v, %v; want syncPlaced and a file", how, got, err)
		}
		defer got.Close()
		a, _ := f.Stat()
		b, err := got.Stat()
		if err != nil || !os.SameFile(a, b) {
			t.Errorf("received %v (%v), want the file sent", b, err)
		}
	})
	t.Run("without a file", func(t *testing.T) {
		shimEnd, initEnd := testSyncSocket(t)
		if err := sendSync(shimEnd, syncMoved, nil); err != nil {
			t.Fatal(err)
		}
		how, got, err := recvSync(initEnd)
		if err != nil || how != syncMoved || got != nil {
			t.Fatalf("recvSync = %d, %v, %v; want syncMoved and no file", how, got, err)
		}
	})
	t.Run("shim gave up", func(t *testing.T) {
		shimEnd, initEnd := testSyncSocket(t)
		shimEnd.Close()
		if _, _, err := recvSync(initEnd); err == nil || !strings.Contains(err.Error(), "aborted") {
			t.Fatalf("recvSync after EOF: %v, want the start aborted", err)
		}
	})
	t.Run("unknown message", func(t *testing.T) {
		shimEnd, initEnd := testSyncSocket(t)
		if err := sendSync(shimEnd, 9, nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := recvSync(initEnd); err == nil {
			t.Fatal("recvSync accepted message 9")
		}
	})
}

func testSyncSocket(t *testing.T) (shimEnd, initEnd *os.File) {
	t.Helper()
	shimEnd, initEnd, err := syncSocket()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		shimEnd.Close()
		initEnd.Close()
	})
	return shimEnd, initEnd
}
