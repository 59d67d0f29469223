//go:build !unix

package producer

import "time"

// processCPU returns 0: the platform's process CPU time is not read here.
func processCPU() time.Duration { return 0 }

// procCPU returns 0: another process's CPU time is read from Linux's /proc only.
func procCPU(string) time.Duration { return 0 }
