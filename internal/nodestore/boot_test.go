package nodestore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// useBootID points the boot id at a file holding id for the test.
func useBootID(t *testing.T, id string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(p, []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := bootIDPath
	bootIDPath = p
	t.Cleanup(func() { bootIDPath = old })
}

func brokenFiles(t *testing.T, path string) []string {
	t.Helper()
	m, _ := filepath.Glob(path + ".broken-*")
	return m
}

func TestStoreKeepsCommitsWithinABoot(t *testing.T) {
	useBootID(t, "boot-a")
	path := filepath.Join(t.TempDir(), "node.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(Sandbox{ID: "sb1", State: StateRunning, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if b, _ := os.ReadFile(path + bootIDSuffix); strings.TrimSpace(string(b)) != "boot-a" {
		t.Fatalf("boot id file = %q", b)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Get("sb1"); err != nil {
		t.Fatalf("record lost across reopen in the same boot: %v", err)
	}
	if b := brokenFiles(t, path); len(b) != 0 {
		t.Fatalf("store moved aside: %v", b)
	}
}

// A store torn by a power loss is replaced after the reboot (nothing in it
// can be owned any more), but never within the boot that wrote it.
func TestTornStoreReplacedOnlyAfterReboot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	useBootID(t, "boot-a")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Put(Sandbox{ID: "sb1", State: StateRunning, CreatedAt: time.Now()})
	s.Close()
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(i * 7)
	}
	if err := os.WriteFile(path, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err == nil {
		t.Fatal("a corrupt store of this boot opened")
	}
	if b := brokenFiles(t, path); len(b) != 0 {
		t.Fatalf("store of this boot moved aside: %v", b)
	}

	useBootID(t, "boot-b")
	s, err = Open(path)
	if err != nil {
		t.Fatalf("after a reboot: %v", err)
	}
	defer s.Close()
	if recs, _ := s.List(); len(recs) != 0 {
		t.Fatalf("fresh store lists %v, %v", recs, err)
	}
	if b := brokenFiles(t, path); len(b) != 1 {
		t.Fatalf("torn store not kept aside: %v", b)
	}
	if b, _ := os.ReadFile(path + bootIDSuffix); strings.TrimSpace(string(b)) != "boot-b" {
		t.Fatalf("boot id file = %q", b)
	}
}

// A sound store from an earlier boot is kept (reconcile reaps its records).
func TestSoundStoreKeptAcrossReboot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	useBootID(t, "boot-a")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Put(Sandbox{ID: "sb1", State: StateRunning, CreatedAt: time.Now()})
	s.Close()
	useBootID(t, "boot-b")
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Get("sb1"); err != nil {
		t.Fatalf("sound store not kept: %v", err)
	}
	if b := brokenFiles(t, path); len(b) != 0 {
		t.Fatalf("sound store moved aside: %v", b)
	}
}
