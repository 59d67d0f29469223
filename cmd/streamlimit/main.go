// Command streamlimit is the one binary of streamlimit: global rate limiting across data
// centers with the counting streamed through Kafka. Its subcommands run the aggregator and
// the enforcer, administer the topics, and analyse the counts topic.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "streamlimit:", err)
		os.Exit(1)
	}
}
