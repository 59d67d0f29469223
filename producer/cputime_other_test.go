//go:build !linux

package producer

// threadCPU returns 0: the thread's CPU time is read on Linux only.
func threadCPU() int64 { return 0 }
