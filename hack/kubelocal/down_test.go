package main

import (
	"context"
	"os"
	"testing"
)

// A veth vanishes when its peer's pod namespace goes, possibly between
// kube-down listing the bridge's ports and deleting them; that must not make
// the teardown (and so the next kube-up) fail.
func TestDeleteLinkThatIsGone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for ip link")
	}
	if err := deleteLink(context.Background(), "cubegone0"); err != nil {
		t.Fatalf("deleting a link that does not exist: %v", err)
	}
}
