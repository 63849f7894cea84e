/* The diffuse command: one function per subcommand, each in its own file. argv[0] is the
 * subcommand's name. Exit status: 0 success, 1 failure, 2 usage error. */
#ifndef DIFFUSE_CLI_H
#define DIFFUSE_CLI_H

int cmd_generate(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_make_tiny(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_config(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
