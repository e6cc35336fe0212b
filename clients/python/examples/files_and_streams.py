"""Late-bound env and files, the workspace, a streamed command with stdin and a signal."""

import sbx

with sbx.Client() as client:
    with client.claim("default", ttl=600, env={"SEED": "7"},
                      files={"job/main.sh": "echo seed=$SEED; cat input.txt"}) as sb:
        sb.files.write("job/input.txt", "42\n")
        print(sb.exec("sh main.sh", cwd="job").stdout, end="")
        print([f.path for f in sb.files.list("job")])

        # Stream output as it comes; feed stdin; stop it with a signal.
        with sb.exec_stream("while read line; do echo got $line; done", stdin=True) as p:
            p.write("a\nb\n")
            p.close_stdin()
            for chunk in p:
                print(chunk.stream, chunk.text, end="")
        print("exit", p.result.exit_code)

        with sb.exec_stream("sleep 600") as p:
            p.send_signal("TERM")
            print("killed by signal", p.wait().signal)
