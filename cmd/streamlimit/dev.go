package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newDevCmd is a placeholder until the dev command lands.
func newDevCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "dev",
		Short:  "(not yet available)",
		Hidden: true,
		RunE:   func(*cobra.Command, []string) error { return errors.New("dev: not yet available") },
	}
}
