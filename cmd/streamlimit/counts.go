package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newCountsCmd is a placeholder until the counts command lands.
func newCountsCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "counts",
		Short:  "(not yet available)",
		Hidden: true,
		RunE:   func(*cobra.Command, []string) error { return errors.New("counts: not yet available") },
	}
}
