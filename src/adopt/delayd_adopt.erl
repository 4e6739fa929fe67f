%% delayd_adopt.erl: the module `delayd adopt` compiles and loads on a
%% broker node for each expression it runs there (read.erl, commit.erl,
%% export.erl), so that a chunk's walk runs as compiled code, not through
%% erl_eval (which took about 2 ms per message on the test VM). It is
%% compiled from this text with compile:forms, loaded as delayd_adopt, and
%% deleted again at the end of each expression.
%%
%% read/8: one chunk of what the delayed-message plugin holds on this node.
%% Walks the plugin's index (an ordered_set of #delay_key{timestamp,
%% exchange}) from just after Cursor, key by key, never copying the table:
%% each key's entries come from the bag table by ets:lookup. With Hold,
%% first suspends the plugin's process (sys:suspend): no timer delivers and
%% no publish to a delayed exchange is stored until commit/5 resumes it.
%% Prints lines "delayd-adopt WORD FIELDS..." (binary fields in base64):
%%   node NODE | notables | held 0|1
%%   entry TIMESTAMP REF ROUTING_KEY PROPERTIES BODY   (ours, to move)
%%   orphan TIMESTAMP      (an index key of ours whose entries are gone)
%%   stats VHOST NAME COUNT BYTES EARLIEST LATEST   (per exchange seen)
%%   cursor KEY | done
%%   end
%%
%% commit/5: deletes exactly the entries a chunk moved (by their refs), then
%% resumes the plugin's process when Resume. Before deleting, it records
%% the refs it is about to delete in a file beside the node's Mnesia tables
%% (synced to disk; Fresh: the chunk's first call, which starts the file
%% anew), so that a rerun can tell an entry delayd deleted from one the
%% plugin delivered, even across a broker restart (check/3). An index key of the exchange
%% is deleted once none of its entries is left (up to 3.11, an index key
%% without entries makes the plugin's timer loop). Entries it does not find
%% are counted and named, not an error: the plugin delivered them after a
%% broker restart or a resume by hand since the read.
%% Prints: was_held 0|1 (0 after a broker restart or a resume by hand since
%% the read), gone TIMESTAMP REF for each entry not found, deleted COUNT,
%% missing COUNT, end.
%%
%% check/3: where each entry Items names is: present TIMESTAMP REF (still
%% in the plugin), deleted TIMESTAMP REF (not there, and the last commit
%% recorded it: delayd deleted it), nothing when the plugin delivered it;
%% then end.
-module(delayd_adopt).
-export([read/8, commit/5, check/3, items/1]).

read(Vhost, Name, Hold, MaxEntries, MaxBytes, MaxScan, Cursor, NotBefore) ->
    Tab = list_to_atom("rabbit_delayed_message" ++ atom_to_list(node())),
    Idx = list_to_atom(atom_to_list(Tab) ++ "_index"),
    Ours = {resource, Vhost, exchange, Name},
    Line = fun(Fields) -> [<<"delayd-adopt">>, [[$\s, F] || F <- Fields], $\n] end,
    Out = fun(Fields) -> io:put_chars(Line(Fields)) end,
    Int = fun(N) -> integer_to_binary(N) end,
    Out([<<"node">>, base64:encode(atom_to_binary(node(), utf8))]),
    Tables = ets:info(Tab, size) =/= undefined andalso ets:info(Idx, size) =/= undefined,
    case Tables of
        false ->
            Out([<<"notables">>]);
        true ->
            P = whereis(rabbit_delayed_message),
            Held = Hold andalso is_pid(P),
            case Held of
                true -> ok = sys:suspend(P, 60000);
                false -> ok
            end,
            Out([<<"held">>, Int(case Held of true -> 1; false -> 0 end)]),
            %% Up to 3.12 an entry holds a #delivery{} around a
            %% #basic_message{}; from 3.13 an mc container.
            Parts = fun(D) ->
                {Rks, C0} =
                    case D of
                        {delivery, _, _, _, {basic_message, _, R, C, _, _}, _, _} -> {R, C};
                        {basic_message, _, R, C, _, _} -> {R, C};
                        Mc -> {mc:routing_keys(Mc), mc:protocol_state(mc:convert(mc_amqpl, Mc))}
                    end,
                C1 = rabbit_binary_generator:ensure_content_encoded(C0, rabbit_framing_amqp_0_9_1),
                Rk = case Rks of [R1 | _] -> R1; [] -> <<>> end,
                {Rk, element(4, C1), iolist_to_binary(lists:reverse(element(6, C1)))}
            end,
            Add = fun(X, Count, Bytes, Ts, Stats) ->
                maps:update_with(X, fun({C, B, Lo, Hi}) -> {C + Count, B + Bytes, min(Lo, Ts), max(Hi, Ts)} end,
                                 {Count, Bytes, Ts, Ts}, Stats)
            end,
            Full = fun(N, B, S) ->
                (MaxEntries > 0 andalso (N >= MaxEntries orelse B >= MaxBytes))
                    orelse (MaxScan > 0 andalso S >= MaxScan)
            end,
            %% Lines are printed together at the end: each io request to
            %% rabbitmqctl's group leader is a round trip.
            Walk = fun Walk(K, N, B, S, Last, Stats, Acc) ->
                case K of
                    '$end_of_table' ->
                        {done, Stats, Acc};
                    _ ->
                        case Full(N, B, S) of
                            true ->
                                {{more, Last}, Stats, Acc};
                            false ->
                                {delay_key, Ts, Ex} = K,
                                X = element(2, Ex),
                                Entries = ets:lookup(Tab, K),
                                Move = X =:= Ours andalso MaxEntries > 0 andalso Ts >= NotBefore,
                                Acc1 = case Move andalso Entries =:= [] of
                                    true -> [Line([<<"orphan">>, Int(Ts)]) | Acc];
                                    false -> Acc
                                end,
                                {Count, Bytes, Acc2} = lists:foldl(
                                    fun(E, {C, By, A}) ->
                                        {Rk, Props, Body} = Parts(element(3, E)),
                                        A2 = case Move of
                                            true ->
                                                Ref = base64:encode(term_to_binary(element(4, E))),
                                                [Line([<<"entry">>, Int(Ts), Ref, base64:encode(Rk),
                                                       base64:encode(Props), base64:encode(Body)]) | A];
                                            false -> A
                                        end,
                                        {C + 1, By + byte_size(Props) + byte_size(Body), A2}
                                    end, {0, 0, Acc1}, Entries),
                                Stats2 = case Count of 0 -> Stats; _ -> Add(X, Count, Bytes, Ts, Stats) end,
                                {N2, B2} = case Move of true -> {N + Count, B + Bytes}; false -> {N, B} end,
                                Walk(ets:next(Idx, K), N2, B2, S + 1, K, Stats2, Acc2)
                        end
                end
            end,
            First = case Cursor of
                        <<>> -> ets:first(Idx);
                        _ -> ets:next(Idx, binary_to_term(base64:decode(Cursor)))
                    end,
            {Next, Stats, Lines} = Walk(First, 0, 0, 0, none, #{}, []),
            io:put_chars(lists:reverse(Lines)),
            maps:foreach(
                fun({resource, V, exchange, Nm}, {C, B, Lo, Hi}) ->
                    Out([<<"stats">>, base64:encode(V), base64:encode(Nm), Int(C), Int(B), Int(Lo), Int(Hi)])
                end, Stats),
            case Next of
                done -> Out([<<"done">>]);
                {more, LastKey} -> Out([<<"cursor">>, base64:encode(term_to_binary(LastKey))])
            end
    end,
    Out([<<"end">>]),
    ok.

%% items/1: commit/5's and check/3's Items from the values delayd passed after the
%% expression (bound to _1, _2, ...): lines "TIMESTAMP REF REF ...".
items(Values) ->
    [begin
         [Ts | Refs] = binary:split(Line, <<" ">>, [global, trim_all]),
         {binary_to_integer(Ts), Refs}
     end || V <- Values, Line <- binary:split(V, <<"\n">>, [global, trim_all])].

commit(Vhost, Name, Items, Resume, Fresh) ->
    Record = [[int(Ts), $\s, T, $\n] || {Ts, Tokens} <- Items, T <- Tokens],
    ok = file:write_file(record_file(), Record, case Fresh of true -> [sync]; false -> [append, sync] end),
    Tab = list_to_atom("rabbit_delayed_message" ++ atom_to_list(node())),
    Idx = list_to_atom(atom_to_list(Tab) ++ "_index"),
    Ours = {resource, Vhost, exchange, Name},
    Out = fun(Fields) -> io:put_chars([<<"delayd-adopt">>, [[$\s, F] || F <- Fields], $\n]) end,
    Int = fun(N) -> integer_to_binary(N) end,
    P = whereis(rabbit_delayed_message),
    WasHeld = is_pid(P) andalso suspended(P),
    Out([<<"was_held">>, Int(case WasHeld of true -> 1; false -> 0 end)]),
    Delete = fun({Ts, Tokens}, {Deleted, Missing}) ->
        Refs = [binary_to_term(base64:decode(T)) || T <- Tokens],
        Keys = keys_at(Idx, Ours, Ts),
        Found = lists:foldl(
            fun(K, F) ->
                Es = [E || E <- ets:lookup(Tab, K), lists:member(element(4, E), Refs)],
                [ok = mnesia:dirty_delete_object(Tab, E) || E <- Es],
                case ets:lookup(Tab, K) of
                    [] -> ok = mnesia:dirty_delete(Idx, K);
                    _ -> ok
                end,
                [element(4, E) || E <- Es] ++ F
            end, [], Keys),
        Lost = [T || {T, R} <- lists:zip(Tokens, Refs), not lists:member(R, Found)],
        [Out([<<"gone">>, Int(Ts), T]) || T <- Lost],
        {Deleted + length(Found), Missing + length(Lost)}
    end,
    Tables = ets:info(Tab, size) =/= undefined andalso ets:info(Idx, size) =/= undefined,
    {D, M} = case Tables of
                 true -> lists:foldl(Delete, {0, 0}, Items);
                 false ->
                     [Out([<<"gone">>, Int(Ts), T]) || {Ts, Tokens} <- Items, T <- Tokens],
                     {0, lists:sum([length(R) || {_, R} <- Items])}
             end,
    case Resume andalso is_pid(P) of
        true -> ok = sys:resume(P, 60000);
        false -> ok
    end,
    Out([<<"deleted">>, Int(D)]),
    Out([<<"missing">>, Int(M)]),
    Out([<<"end">>]),
    ok.

check(Vhost, Name, Items) ->
    Tab = list_to_atom("rabbit_delayed_message" ++ atom_to_list(node())),
    Idx = list_to_atom(atom_to_list(Tab) ++ "_index"),
    Ours = {resource, Vhost, exchange, Name},
    Out = fun(Fields) -> io:put_chars([<<"delayd-adopt">>, [[$\s, F] || F <- Fields], $\n]) end,
    Recorded = case file:read_file(record_file()) of
                   {ok, Bin} -> sets:from_list(binary:split(Bin, <<"\n">>, [global, trim_all]));
                   {error, enoent} -> sets:new()
               end,
    Tables = ets:info(Tab, size) =/= undefined andalso ets:info(Idx, size) =/= undefined,
    [begin
         Ref = binary_to_term(base64:decode(T)),
         Here = Tables andalso lists:any(
                  fun(E) -> element(4, E) =:= Ref end,
                  lists:append([ets:lookup(Tab, K) || K <- keys_at(Idx, Ours, Ts)])),
         Line = [int(Ts), T],
         case {Here, sets:is_element(iolist_to_binary([int(Ts), $\s, T]), Recorded)} of
             {true, _} -> Out([<<"present">> | Line]);
             {false, true} -> Out([<<"deleted">> | Line]);
             {false, false} -> ok
         end
     end || {Ts, Tokens} <- Items, T <- Tokens],
    Out([<<"end">>]),
    ok.

%% The index keys of exchange Ours at timestamp Ts.
keys_at(Idx, Ours, Ts) ->
    keys_from(Idx, Ours, Ts, ets:next(Idx, {delay_key, Ts, 0}), []).

keys_from(Idx, Ours, Ts, K, Acc) ->
    case K of
        {delay_key, Ts, Ex} when element(2, Ex) =:= Ours -> keys_from(Idx, Ours, Ts, ets:next(Idx, K), [K | Acc]);
        {delay_key, Ts, _} -> keys_from(Idx, Ours, Ts, ets:next(Idx, K), Acc);
        _ -> Acc
    end.

%% Where commit/5 records what it deletes: beside this node's Mnesia
%% tables, so it outlives a broker restart as they do.
record_file() ->
    filename:join(mnesia:system_info(directory), "delayd-adopt-deleting").

int(N) -> integer_to_binary(N).

%% Whether process P is suspended (sys:suspend): sys:get_status answers
%% while it is.
suspended(P) ->
    case sys:get_status(P, 60000) of
        {status, _, _, [_, suspended | _]} -> true;
        _ -> false
    end.
