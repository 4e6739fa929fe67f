%% export.erl: the two-step form's first step, for an operator to run with
%% `rabbitmqctl -n NODE eval_file FILE` on a node delayd cannot reach: read.erl, without a
%% hold, writing its lines to a file on the broker host instead of standard
%% output, for `delayd adopt --from FILE`.
%% Placeholders (filled by src/adopt/erlang.rs):
%%   @PATH@  the file to write, base64
%%   @READ@  read.erl's expression, without its final full stop
%% Prints "exported to PATH" and returns ok; the file holds read.erl's lines.
begin
    Path = unicode:characters_to_list(base64:decode(<<"@PATH@">>)),
    {ok, File} = file:open(Path, [write, binary]),
    Leader = group_leader(),
    group_leader(File, self()),
    try
        @READ@
    after
        group_leader(Leader, self()),
        ok = file:sync(File),
        ok = file:close(File)
    end,
    io:format("exported to ~ts~n", [Path]),
    ok
end.
