package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SDKRun is one SDK run's latencies.
type SDKRun struct {
	Concurrency int `json:"concurrency"`
	// Create is Sandbox.create(); FirstCmd the first commands.run('true')
	// after it; Total their sum per sandbox (create -> first command done).
	Create   Summary `json:"create"`
	FirstCmd Summary `json:"firstCmd"`
	Total    Summary `json:"total"`
	Kill     Summary `json:"kill"`
}

// SDKResult is the official e2b SDK's view of Cube.
type SDKResult struct {
	Serial     SDKRun `json:"serial"`
	Concurrent SDKRun `json:"concurrent"`
	Error      string `json:"error,omitempty"`
}

// sdkRaw is what test/bench/sdk.mjs prints.
type sdkRaw struct {
	Create   []float64 `json:"create"`
	FirstCmd []float64 `json:"firstCmd"`
	Total    []float64 `json:"total"`
	Kill     []float64 `json:"kill"`
	Errors   []string  `json:"errors"`
}

// SDKConfig says how to run the SDK script.
type SDKConfig struct {
	Dir         string // test/bench (holds sdk.mjs and package.json)
	Server, Key string
	Template    string
	NSerial     int
	NConcurrent int
	Concurrency int
}

// RunSDK installs the pinned SDK in cfg.Dir if needed (npm ci), runs
// sdk.mjs and summarizes its samples.
func RunSDK(ctx context.Context, cfg SDKConfig) SDKResult {
	fail := func(err error) SDKResult { return SDKResult{Error: err.Error()} }
	if _, err := os.Stat(filepath.Join(cfg.Dir, "sdk.mjs")); err != nil {
		return fail(fmt.Errorf("SDK benchmark script: %w (pass --sdk-dir)", err))
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "node_modules", "e2b")); err != nil {
		npm := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		npm.Dir = cfg.Dir
		if out, err := npm.CombinedOutput(); err != nil {
			return fail(fmt.Errorf("npm ci in %s: %w: %s", cfg.Dir, err, bytes.TrimSpace(out)))
		}
	}
	cmd := exec.CommandContext(ctx, "node", "sdk.mjs",
		"--template", cfg.Template,
		"--n-serial", strconv.Itoa(cfg.NSerial),
		"--n-concurrent", strconv.Itoa(cfg.NConcurrent),
		"--concurrency", strconv.Itoa(cfg.Concurrency))
	cmd.Dir = cfg.Dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+cfg.Server, "E2B_SANDBOX_URL="+cfg.Server, "E2B_API_KEY="+cfg.Key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fail(fmt.Errorf("node sdk.mjs: %w: %s", err, lastLine(stderr.String())))
	}
	return ParseSDK(out, cfg.Concurrency)
}

// ParseSDK summarizes the JSON printed by sdk.mjs.
func ParseSDK(out []byte, conc int) SDKResult {
	var raw struct{ Serial, Concurrent sdkRaw }
	if err := json.Unmarshal(bytes.TrimSpace(out), &raw); err != nil {
		return SDKResult{Error: fmt.Sprintf("parse sdk.mjs output: %v", err)}
	}
	return SDKResult{Serial: raw.Serial.summary(1), Concurrent: raw.Concurrent.summary(conc)}
}

func (r sdkRaw) summary(conc int) SDKRun {
	first := ""
	if len(r.Errors) > 0 {
		first = r.Errors[0]
	}
	s := func(v []float64, errs int) Summary { return Summarize(msDurations(v), errs, first) }
	return SDKRun{
		Concurrency: conc,
		Create:      s(r.Create, len(r.Errors)),
		FirstCmd:    s(r.FirstCmd, 0),
		Total:       s(r.Total, len(r.Errors)),
		Kill:        s(r.Kill, 0),
	}
}

func msDurations(v []float64) []time.Duration {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x * float64(time.Millisecond))
	}
	return d
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
