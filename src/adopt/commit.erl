%% commit.erl: deletes from the delayed-message plugin on this node exactly
%% the entries a chunk moved (by their refs, which read.erl printed), then
%% resumes the plugin's process; run with `rabbitmqctl eval` (the expression
%% on standard input) once Redis holds them.
%% An index key of the exchange is deleted once none of its entries is left
%% (up to 3.11, an index key without entries makes the plugin's timer loop).
%% Entries of the chunk it does not find are counted, not an error: a rerun
%% after a crash may commit a chunk a second time.
%% Placeholders (filled by src/adopt/erlang.rs):
%%   @VHOST@ @NAME@  the exchange moved, base64
%%   @ITEMS@         [{TIMESTAMP, [REF, ...]}, ...], each REF as read.erl printed it
%%   @RESUME@        true | false (false: leave the plugin as it is)
%% Prints lines "delayd-adopt WORD FIELDS...":
%%   was_held 0|1    (whether the plugin was still suspended: 0 after a
%%                    broker restart or a resume by hand since read.erl)
%%   deleted COUNT | missing COUNT | end
begin
    Vhost = base64:decode(<<"@VHOST@">>),
    Name = base64:decode(<<"@NAME@">>),
    Items = @ITEMS@,
    Resume = @RESUME@,
    Tab = list_to_atom("rabbit_delayed_message" ++ atom_to_list(node())),
    Idx = list_to_atom(atom_to_list(Tab) ++ "_index"),
    Ours = {resource, Vhost, exchange, Name},
    Out = fun(Fields) -> io:put_chars([<<"delayd-adopt">>, [[$\s, F] || F <- Fields], $\n]) end,
    Int = fun(N) -> integer_to_binary(N) end,
    P = whereis(rabbit_delayed_message),
    WasHeld = is_pid(P) andalso
        case sys:get_status(P, 60000) of
            {status, _, _, [_, suspended | _]} -> true;
            _ -> false
        end,
    Out([<<"was_held">>, Int(case WasHeld of true -> 1; false -> 0 end)]),
    KeysAt = fun KeysAt(K, Ts, Acc) ->
        case K of
            {delay_key, Ts, Ex} when element(2, Ex) =:= Ours -> KeysAt(ets:next(Idx, K), Ts, [K | Acc]);
            {delay_key, Ts, _} -> KeysAt(ets:next(Idx, K), Ts, Acc);
            _ -> Acc
        end
    end,
    Delete = fun({Ts, Tokens}, {Deleted, Missing}) ->
        Refs = [binary_to_term(base64:decode(T)) || T <- Tokens],
        Keys = KeysAt(ets:next(Idx, {delay_key, Ts, 0}), Ts, []),
        Gone = lists:foldl(
            fun(K, G) ->
                Es = [E || E <- ets:lookup(Tab, K), lists:member(element(4, E), Refs)],
                [ok = mnesia:dirty_delete_object(Tab, E) || E <- Es],
                case ets:lookup(Tab, K) of
                    [] -> ok = mnesia:dirty_delete(Idx, K);
                    _ -> ok
                end,
                G + length(Es)
            end, 0, Keys),
        {Deleted + Gone, Missing + length(Refs) - Gone}
    end,
    Tables = ets:info(Tab, size) =/= undefined andalso ets:info(Idx, size) =/= undefined,
    {D, M} = case Tables of
                 true -> lists:foldl(Delete, {0, 0}, Items);
                 false -> {0, lists:sum([length(R) || {_, R} <- Items])}
             end,
    case Resume andalso is_pid(P) of
        true -> ok = sys:resume(P, 60000);
        false -> ok
    end,
    Out([<<"deleted">>, Int(D)]),
    Out([<<"missing">>, Int(M)]),
    Out([<<"end">>]),
    ok
end.
