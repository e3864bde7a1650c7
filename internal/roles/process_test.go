package roles

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A killed process that is not reaped yet (a zombie) is not running: a
// cube up SIGKILLed under a busy parent must not block the next start.
func TestProcessAliveZombieIsDead(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait()
	if !processAlive(pid) {
		t.Fatal("a running process reported dead")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !zombie(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("killed child never became a zombie")
		}
	}
	if processAlive(pid) {
		t.Fatal("an unreaped zombie reported alive")
	}
	if processAlive(os.Getpid()) == false {
		t.Fatal("this process reported dead")
	}
}
