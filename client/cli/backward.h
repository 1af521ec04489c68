/* lnorm backward (client/cli/backward.c). */
#ifndef LNORM_CLI_BACKWARD_H
#define LNORM_CLI_BACKWARD_H

extern const char *const lnorm__usage_backward;

/* Run the backward command (argv[0] is the program); the exit status. */
int lnorm__cmd_backward(int argc, char **argv);

#endif
