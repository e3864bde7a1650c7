package leader

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "CUBE_LEADER_HELPER_DSN"

// TestHelperLeaderProcess is not a test: run by
// TestPostgresFailoverWhenLeaderProcessKilled as a separate leader process.
func TestHelperLeaderProcess(t *testing.T) {
	dsn := os.Getenv(helperEnv)
	if dsn == "" {
		t.Skip("helper process only")
	}
	e, err := NewPostgres(dsn, PostgresConfig{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	Run(context.Background(), e, func(ctx context.Context) error {
		fmt.Println("leading")
		<-ctx.Done()
		return nil
	})
}

func TestPostgresFailoverWhenLeaderProcessKilled(t *testing.T) {
	dsn, _ := setup(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperLeaderProcess$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+dsn)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	leading := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "leading" {
				close(leading)
				break
			}
		}
		for sc.Scan() {
		}
	}()
	select {
	case <-leading:
	case <-time.After(handoverBound):
		t.Fatal("helper process did not become leader")
	}
	var c cluster
	b := startReplica(t, &c, dsn, "b")
	// b must not lead while the helper lives.
	select {
	case <-b.started:
		t.Fatal("b leads while the helper process holds the lock")
	case <-time.After(3 * time.Second):
	}
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, at := waitLeader(t, b)
	took := at.Sub(killed)
	t.Logf("leader process killed (SIGKILL); b leads after %v", took)
	if took > handoverBound {
		t.Fatalf("handover took %v, want <= %v", took, handoverBound)
	}
}
